//! The same figures under vLLM's metric names, for the tools that read only those: Kubernetes
//! inference gateways (Gateway API Inference Extension's endpoint picker, llm-d) route on
//! `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` and the prefix-cache counters.
//! Every series carries `model_name`, as vLLM's do. `/metrics` appends these after `vigil_*`.

use crate::metrics::ServerMetrics;
use std::fmt::Write;
use std::sync::atomic::Ordering;
use vigil_engine::engine_thread::EngineStats;

/// A label value with `\`, `"` and newlines escaped (the text format's rules).
fn escaped(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

pub fn render(out: &mut String, m: &ServerMetrics, engine: &EngineStats, model: &str) {
    let label = format!("model_name=\"{}\"", escaped(model));
    let u = |a: &std::sync::atomic::AtomicUsize| a.load(Ordering::Relaxed) as f64;
    let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let total = u(&engine.kv_blocks_total);
    let usage = if total == 0.0 {
        0.0
    } else {
        (total - u(&engine.kv_blocks_free)) / total
    };
    let gauges = [
        (
            "vllm:num_requests_running",
            "Requests being computed (client and session work).",
            u(&engine.running),
        ),
        (
            "vllm:num_requests_waiting",
            "Requests waiting to be scheduled.",
            u(&engine.waiting),
        ),
        (
            "vllm:kv_cache_usage_perc",
            "Share of KV cache blocks held by sequences (1 = full).",
            usage,
        ),
    ];
    for (name, help, v) in gauges {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{label}}} {v}"
        );
    }
    let counters = [
        (
            "vllm:prefix_cache_queries_total",
            "Prompt tokens looked up in the prefix cache.",
            l(&engine.prompt_tokens),
        ),
        (
            "vllm:prefix_cache_hits_total",
            "Prompt tokens served from the prefix cache.",
            l(&engine.prefix_cached_tokens),
        ),
        (
            "vllm:prompt_tokens_total",
            "Prompt tokens of finished requests.",
            l(&engine.prompt_tokens),
        ),
        (
            "vllm:generation_tokens_total",
            "Tokens generated.",
            l(&engine.generated_tokens),
        ),
        (
            "vllm:num_preemptions_total",
            "Sequences preempted by recompute.",
            l(&engine.preemptions),
        ),
        (
            "vllm:spec_decode_num_drafts_total",
            "Speculative decoding: drafts verified.",
            l(&engine.spec_drafts),
        ),
        (
            "vllm:spec_decode_num_draft_tokens_total",
            "Speculative decoding: draft tokens verified.",
            l(&engine.spec_draft_tokens),
        ),
        (
            "vllm:spec_decode_num_accepted_tokens_total",
            "Speculative decoding: draft tokens accepted.",
            l(&engine.spec_accepted_tokens),
        ),
    ];
    for (name, help, v) in counters {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{label}}} {v}"
        );
    }
    let series = format!("{label},");
    m.ttft.render_labelled(
        out,
        "vllm:time_to_first_token_seconds",
        "Time to first token.",
        &series,
    );
    m.inter_token.render_labelled(
        out,
        "vllm:inter_token_latency_seconds",
        "Time between consecutive tokens.",
        &series,
    );
    m.e2e.render_labelled(
        out,
        "vllm:e2e_request_latency_seconds",
        "Time from arrival to the request's end.",
        &series,
    );
}
