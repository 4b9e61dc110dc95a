#!/usr/bin/env python3
"""Reference token ids for Vigil's tokenizer tests.

For every string of a shared corpus this records the ids (with and without special tokens)
and the decoded text, as produced by the reference implementations:
  * HF `tokenizers` for the tokenizer.json of Qwen3 and Llama 3.1
    ($VIGIL_TEST_TOKENIZERS/{qwen3,llama3_1}/tokenizer.json);
  * llama.cpp (llama-cpp-python, vocab only) for the vocabulary embedded in the SmolLM2 GGUF
    ($VIGIL_TEST_GGUF);
  * llama.cpp's llama-server for the SentencePiece vocabulary of the Gemma 3 270M GGUF
    (--gemma-server URL, a server running that model; see `llama_server_fixture`).
Writes tests/fixtures/tokenizer/{qwen3,llama3_1,smollm2_gguf,gemma3_gguf}.json, each one only
when its input is given. The fixtures hold ids and the corpus's own decoded text, nothing else
of a vocabulary.

Usage: VIGIL_TEST_TOKENIZERS=dir VIGIL_TEST_GGUF=model.gguf make_tokenizer_fixtures.py
       make_tokenizer_fixtures.py --gemma-server http://127.0.0.1:18711

gemma3_gguf.json was made with llama.cpp b1-0c1e570 (the llama.cpp of llama-cpp-python 0.3.36,
built natively) serving the GGUF that scripts/fetch_test_assets.sh assembles
(sha256 a5fd3b62…6818):
  llama-server -m .cache/gemma-3-270m-q4_k_m.gguf --port 18711 -t 1 -c 512
  scripts/make_tokenizer_fixtures.py --gemma-server http://127.0.0.1:18711
"""
import argparse
import json
import os
import pathlib
import urllib.request

CORPUS = [
    "",
    "Hello, world!",
    " leading space",
    "   three leading spaces",
    "trailing spaces   ",
    "Hello\nworld\n\nnew paragraph\n",
    "\ttab\tseparated\tvalues\n\t\tindented",
    "mixed \t \n whitespace \r\n runs     ",
    "I'm sure you'll see they've said it's what we'd do, OK? DON'T SHOUT, IT'S LOUD",
    "1234567890 12 345 6789 3.14159 -42 1e10",
    "99999999999999999999999999999999999999",
    "Numbers: ١٢٣٤ (Arabic-Indic) ½ ² Ⅻ",
    "日本語のテキストです。漢字、ひらがな、カタカナ。",
    "中文测试：今天天气很好，我们去公园散步吧！",
    "한국어 문장입니다.",
    "Emoji: 😀👍🏽🎉 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵",
    "Combining marks: e\u0301 a\u0308 n\u0303 \u1e9b\u0323 Z\u0351\u036b\u0343\u036a",
    "Precomposed vs decomposed: é é Å Å",
    "RTL: שלום עולם and مرحبا بالعالم mixed with LTR",
    "Ελληνικά και русский текст",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "fn main() { let x: Vec<u32> = (0..10).map(|i| i * i).collect(); println!(\"{x:?}\"); }",
    "<html><body class=\"main\">&amp; &lt;tag&gt;</body></html>",
    "SELECT * FROM users WHERE id = 42 AND name LIKE '%smith%';",
    "$ echo \"hello\" | grep -E '^h.*o$' && ls -la ~/.config",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nHi<|eot_id|>",
    "text before<|endoftext|>text after",
    "not special: <|im_start |> <im_start> <|fake|>",
    "<think>\nreasoning here\n</think>\n\nanswer",
    "https://example.com/path?query=value&other=1#fragment",
    "email@example.com, @handle, #hashtag",
    "ALLCAPS lowercase CamelCase snake_case kebab-case",
    "a" * 64,
    "  \n  \n",
    " ",
    "\n",
    "Ünïcödé ßtraße Ærøskøbing ÿ",
    "math: ∀x∈ℝ, x² ≥ 0; ∑ᵢ aᵢ → ∞ ≠ ≈",
    "zero\u200bwidth\u200djoiner\ufeffbom",
    "replacement char \ufffd stays",
    "quotes “smart” ‘single’ «guillemets» — dash – en",
]

# Only for the Gemma 3 vocabulary: its turn markers, a user-defined `</s>` that llama.cpp makes
# a control token, user-defined whitespace runs and HTML tags, unused and multimodal tokens,
# characters missing from the vocabulary (byte fallback), text that spells a byte token or `▁`.
GEMMA_EXTRA = [
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text<eos> and a</s>b",
    "<unused0> <mask> [multimodal] <start_of_image><end_of_image>",
    "<table><tr><td>cell</td></tr></table> <h1>Title</h1>",
    "x    y\t\t\tz\n\n\n\n\n end  ",
    "\x00\x01\x7f control bytes \U00020000\U0002a6a5 \U0001fae8",
    "literal <0x41> and \u2581 and \u2581\u2581 ",
]


def hf_fixture(tok_json):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_json))
    cases = []
    for text in CORPUS:
        ids = tok.encode(text, add_special_tokens=False).ids
        ids_special = tok.encode(text, add_special_tokens=True).ids
        cases.append(
            {
                "text": text,
                "ids": ids,
                "ids_add_special": ids_special,
                "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
            }
        )
    return {"reference": "tokenizers " + __import__("tokenizers").__version__, "cases": cases}


def gguf_fixture(gguf_path):
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(gguf_path), vocab_only=True, verbose=False)
    cases = []
    for text in CORPUS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        ids_special = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        cases.append(
            {
                "text": text,
                "ids": ids,
                "ids_add_special": ids_special,
                "decoded": llm.detokenize(ids, special=True).decode("utf-8", errors="replace"),
                "decoded_skip_special": llm.detokenize(ids, special=False).decode("utf-8", errors="replace"),
            }
        )
    return {"reference": "llama-cpp-python " + llama_cpp.__version__, "cases": cases}


def llama_server_fixture(url, corpus):
    """The corpus through a running llama-server: `POST /tokenize` (special tokens parsed, with
    and without BOS) and `POST /detokenize`, which is llama.cpp's detokenization with special
    tokens rendered. The server has no way to skip special tokens, so `decoded_skip_special`
    detokenizes the ids left after dropping control and unknown tokens, which is what
    llama.cpp does when asked not to render them."""

    def post(path, body=None):
        data = None if body is None else json.dumps(body).encode("utf-8")
        req = urllib.request.Request(
            url.rstrip("/") + path, data=data, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.load(resp)

    def tokenize(text, add_special, parse_special=True):
        body = {"content": text, "add_special": add_special, "parse_special": parse_special}
        return post("/tokenize", body)["tokens"]

    def detokenize(ids):
        return post("/detokenize", {"tokens": ids})["content"]

    control = {}

    def is_control(token):
        # A control (or unknown) token's text becomes that token only when special tokens are
        # parsed; a user-defined or normal token's text becomes it either way.
        if token not in control:
            piece = detokenize([token])
            control[token] = tokenize(piece, False) == [token] and tokenize(
                piece, False, parse_special=False
            ) != [token]
        return control[token]

    cases = []
    for text in corpus:
        ids = tokenize(text, False)
        cases.append(
            {
                "text": text,
                "ids": ids,
                "ids_add_special": tokenize(text, True),
                "decoded": detokenize(ids),
                "decoded_skip_special": detokenize([i for i in ids if not is_control(i)]),
            }
        )
    build = post("/props").get("build_info", "unknown build")
    return {"reference": f"llama.cpp llama-server {build}", "cases": cases}


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--gemma-server", metavar="URL", help="a llama-server running the Gemma 3 270M GGUF"
    )
    args = parser.parse_args()
    out = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tokenizer"
    out.mkdir(parents=True, exist_ok=True)
    fixtures = {}
    if "VIGIL_TEST_TOKENIZERS" in os.environ:
        tok_dir = pathlib.Path(os.environ["VIGIL_TEST_TOKENIZERS"])
        fixtures["qwen3"] = hf_fixture(tok_dir / "qwen3" / "tokenizer.json")
        fixtures["llama3_1"] = hf_fixture(tok_dir / "llama3_1" / "tokenizer.json")
    if "VIGIL_TEST_GGUF" in os.environ:
        fixtures["smollm2_gguf"] = gguf_fixture(os.environ["VIGIL_TEST_GGUF"])
    if args.gemma_server:
        fixtures["gemma3_gguf"] = llama_server_fixture(args.gemma_server, CORPUS + GEMMA_EXTRA)
    if not fixtures:
        parser.error("nothing to do: set VIGIL_TEST_TOKENIZERS, VIGIL_TEST_GGUF or --gemma-server")
    for name, data in fixtures.items():
        with open(out / f"{name}.json", "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
