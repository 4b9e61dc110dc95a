"""Prompt scoring through the completions API: `echo` with `logprobs` and vLLM's
`prompt_logprobs`. A prompt token's score is the log-probability the model gave it after the
tokens before it, so echoing a generated continuation must score each of its tokens exactly as
they were scored when generated (Vigil's logits are the same bits alone, chunked or batched).
Scored rows are always computed, never served from the prefix cache."""

from __future__ import annotations

import math

import httpx

from test_openai_sdk import make_client

PROMPT = "The capital of France is Paris. The capital of Italy is"


def completions(server, **body) -> dict:
    r = httpx.post(f"{server.v1}/completions", json={"temperature": 0, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_echo_scores_equal_the_tokens_logprobs_when_generated(smol):
    server = smol
    ids = httpx.post(f"{server.url}/tokenize", json={"prompt": PROMPT}, timeout=30).json()["tokens"]
    gen = completions(server, prompt=ids, max_tokens=8, logprobs=1, ignore_eos=True)["choices"][0]
    gen_lps = gen["logprobs"]["token_logprobs"]
    assert len(gen_lps) == 8
    # The generated ids: each token's top-1 alternative at temperature 0 is the token itself.
    texts = gen["logprobs"]["tokens"]
    gen_ids = [httpx.post(f"{server.url}/tokenize", json={"prompt": t, "add_special_tokens": False},
                          timeout=30).json()["tokens"] for t in texts]
    assert all(len(g) == 1 for g in gen_ids), gen_ids
    full = ids + [g[0] for g in gen_ids]
    echo = completions(server, prompt=full, max_tokens=1, logprobs=1, echo=True)["choices"][0]
    lp = echo["logprobs"]
    assert echo["text"].startswith(PROMPT)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert len(lp["token_logprobs"]) == len(full) + 1
    scored = lp["token_logprobs"][len(ids): len(full)]
    assert scored == gen_lps, (scored, gen_lps)


def test_prompt_logprobs_shape_and_agreement_with_echo(smol):
    body = dict(prompt=PROMPT, max_tokens=1, logprobs=2, echo=True, prompt_logprobs=3)
    c = completions(smol, **body)["choices"][0]
    pl = c["prompt_logprobs"]
    n = len(pl)
    assert pl[0] is None and n >= 10
    echo_lps = c["logprobs"]["token_logprobs"][:n]
    for i in range(1, n):
        entries = pl[i]
        assert 3 <= len(entries) <= 4
        ranks = sorted(e["rank"] for e in entries.values())
        assert ranks[:3] == [1, 2, 3] or min(ranks) == 1
        assert echo_lps[i] in [e["logprob"] for e in entries.values()]
        for e in entries.values():
            assert e["logprob"] <= 0 and isinstance(e["decoded_token"], str)
    # Asked twice: the second request's prompt is in the prefix cache, the scores do not change.
    again = completions(smol, **body)["choices"][0]
    assert again["prompt_logprobs"] == pl


def test_perplexity_through_the_api_prefers_sense(smol):
    def ppl(text: str) -> float:
        c = completions(smol, prompt=text, max_tokens=1, logprobs=0, echo=True)["choices"][0]
        lps = [x for x in c["logprobs"]["token_logprobs"][1:-1] if x is not None]
        return math.exp(-sum(lps) / len(lps))

    sense = "The cat sat on the mat and looked out of the window at the birds in the garden."
    words = sense.split()
    nonsense = " ".join(words[::2] + words[1::2])
    assert ppl(sense) < ppl(nonsense)


def test_prompt_scores_refuse_stream_and_stop(smol):
    for extra, param in [({"stream": True, "echo": True}, "echo"), ({"stop": ["x"], "prompt_logprobs": 1}, "prompt_logprobs"),
                         ({"prompt_logprobs": 21}, "prompt_logprobs")]:
        r = httpx.post(f"{smol.v1}/completions", json={"prompt": "hi", "max_tokens": 2, **extra}, timeout=30)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param


def test_the_sdk_reads_echo(smol):
    client = make_client(smol)
    r = client.completions.create(model="m", prompt=PROMPT, max_tokens=2, echo=True, logprobs=1, temperature=0)
    assert r.choices[0].text.startswith(PROMPT)
    assert r.choices[0].logprobs.token_logprobs[0] is None


def test_chat_prompt_logprobs_score_the_rendered_prompt(smol):
    """vLLM's `prompt_logprobs` on chat: at the response's top level, one entry per rendered
    prompt token (the first `null`), equal to the completions route's scores for the same ids."""
    messages = [{"role": "user", "content": "Name three rivers in Europe."}]
    r = httpx.post(f"{smol.v1}/chat/completions", json={
        "messages": messages, "max_tokens": 3, "temperature": 0, "prompt_logprobs": 2,
        "logprobs": True, "top_logprobs": 1}, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    pl = body["prompt_logprobs"]
    assert len(pl) == body["usage"]["prompt_tokens"] and pl[0] is None
    assert all(2 <= len(e) <= 3 and min(x["rank"] for x in e.values()) == 1 for e in pl[1:])
    # The generated tokens keep the one alternative they asked for.
    assert all(len(t["top_logprobs"]) == 1 for t in body["choices"][0]["logprobs"]["content"])
    ids = httpx.post(f"{smol.url}/tokenize", json={"messages": messages}, timeout=30).json()["tokens"]
    assert len(ids) == len(pl)
    same = completions(smol, prompt=ids, max_tokens=1, prompt_logprobs=2)["choices"][0]["prompt_logprobs"]
    assert same == pl


def test_chat_prompt_logprobs_refusals(smol):
    msgs = [{"role": "user", "content": "hi"}]
    for extra in ({"stream": True}, {"stop": ["x"]}, {"n": 2}, {}):
        k = 21 if not extra else 1
        r = httpx.post(f"{smol.v1}/chat/completions", json={
            "messages": msgs, "max_tokens": 2, "prompt_logprobs": k, **extra}, timeout=30)
        assert r.status_code == 400, (extra, r.text)
        assert r.json()["error"]["param"] == "prompt_logprobs"
