//! The `POST /v1/responses` body, parsed strictly: unknown fields are refused by name; known
//! ones Vigil does not apply are accepted and listed in docs/api.md.

use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponsesRequest {
    pub model: Option<String>,
    /// Text (one user message) or a list of items.
    pub input: Option<Value>,
    /// A system message for this request only (not carried to continuations).
    pub instructions: Option<String>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub max_tool_calls: Option<u32>,
    pub text: Option<TextConfig>,
    pub reasoning: Option<ReasoningConfig>,
    pub max_output_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_logprobs: Option<u32>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub store: Option<bool>,
    pub previous_response_id: Option<String>,
    pub include: Option<Vec<String>>,
    pub metadata: Option<Value>,
    /// `disabled` (the default) or `auto`; a prompt past the context is a 400 either way.
    pub truncation: Option<String>,
    /// Refused when true: Vigil answers while the client waits.
    pub background: Option<bool>,
    /// Refused: the Conversations API is not served; `previous_response_id` continues instead.
    pub conversation: Option<Value>,
    /// Refused: reusable prompt templates live on OpenAI's side.
    pub prompt: Option<Value>,
    /// Accepted and ignored (docs/api.md).
    pub user: Option<String>,
    pub service_tier: Option<String>,
    pub prompt_cache_key: Option<String>,
    pub prompt_cache_retention: Option<String>,
    pub safety_identifier: Option<String>,
    /// Vigil's and vLLM's sampling extras.
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub stop: Option<Value>,
    pub ignore_eos: Option<bool>,
    pub speculative: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextConfig {
    pub format: Option<Value>,
    /// Accepted and ignored.
    pub verbosity: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReasoningConfig {
    pub effort: Option<String>,
    /// Accepted and ignored: reasoning is returned whole, never summarized.
    pub summary: Option<String>,
    pub generate_summary: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// Accepted and ignored (OpenAI's padding of events against side channels).
    pub include_obfuscation: Option<bool>,
}
