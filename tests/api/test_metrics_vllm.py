"""`/metrics` parsed by `prometheus_client`, as a scraper reads it: the whole exposition is valid,
and the vLLM names that Kubernetes inference gateways read (Gateway API Inference Extension,
llm-d) are there with `model_name`, and move with the traffic."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from test_openai_sdk import make_client


def scrape(server) -> dict:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families: dict, family: str, sample: str, **labels) -> float:
    for s in families[family].samples:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError(sample)


def test_vllm_metric_names_parse_and_follow_the_traffic(smol):
    client = make_client(smol)
    model = client.models.list().data[0].id
    before = scrape(smol)
    assert any(name.startswith("vigil_") for name in before), "the vigil_* families parse too"
    prompt = "Repeat after me: the quick brown fox jumps over the lazy dog. " * 4
    for _ in range(2):
        client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0)
    after = scrape(smol)
    for family, kind in [
        ("vllm:num_requests_running", "gauge"),
        ("vllm:num_requests_waiting", "gauge"),
        ("vllm:kv_cache_usage_perc", "gauge"),
        ("vllm:prefix_cache_queries", "counter"),
        ("vllm:prefix_cache_hits", "counter"),
        ("vllm:prompt_tokens", "counter"),
        ("vllm:generation_tokens", "counter"),
        ("vllm:time_to_first_token_seconds", "histogram"),
        ("vllm:inter_token_latency_seconds", "histogram"),
        ("vllm:e2e_request_latency_seconds", "histogram"),
    ]:
        assert after[family].type == kind, family
        assert all(s.labels.get("model_name") == model for s in after[family].samples), family
    usage = value(after, "vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_perc")
    assert 0.0 <= usage <= 1.0
    grew = lambda fam, s: value(after, fam, s) - value(before, fam, s)
    assert grew("vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total") >= 2 * 50
    # The second identical prompt is served from the prefix cache (all but its last block).
    assert grew("vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total") >= 32
    assert value(after, "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total") <= value(
        after, "vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total")
    assert grew("vllm:generation_tokens", "vllm:generation_tokens_total") >= 8
    assert grew("vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count") >= 2
    assert grew("vllm:e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds_count") >= 2
    ttft_sum = value(after, "vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_sum")
    assert ttft_sum == value(after, "vigil_time_to_first_token_seconds", "vigil_time_to_first_token_seconds_sum")
