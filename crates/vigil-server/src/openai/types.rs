//! OpenAI request bodies, parsed strictly (unknown fields are refused by name).

use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged, expecting = "expected a string or an array of strings")]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
    /// Accepted for compatibility; usage chunks are never sent continuously.
    pub continuous_usage_stats: Option<bool>,
    /// Accepted and ignored: OpenAI's padding of stream events against side channels.
    pub include_obfuscation: Option<bool>,
}

/// Sampling and stopping fields shared by chat and text completions.
#[derive(Debug, Default, Deserialize)]
pub struct CommonParams {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub logit_bias: Option<BTreeMap<String, f32>>,
    pub seed: Option<i64>,
    pub stop: Option<StopField>,
    pub n: Option<u32>,
    pub ignore_eos: Option<bool>,
    pub min_tokens: Option<u32>,
    /// Vigil's: speculative decoding for this request (`off`, `ngram`, `suffix`).
    pub speculative: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatCompletionRequest {
    pub messages: Vec<ChatMessage>,
    pub model: Option<String>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub logit_bias: Option<BTreeMap<String, f32>>,
    pub seed: Option<i64>,
    pub stop: Option<StopField>,
    pub n: Option<u32>,
    pub ignore_eos: Option<bool>,
    pub min_tokens: Option<u32>,
    /// Vigil's: speculative decoding for this request (`off`, `ngram`, `suffix`).
    pub speculative: Option<String>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u32>,
    /// vLLM's: score the rendered prompt, with this many top alternatives per position.
    pub prompt_logprobs: Option<u32>,
    pub tools: Option<Vec<ToolDef>>,
    pub tool_choice: Option<ToolChoice>,
    pub parallel_tool_calls: Option<bool>,
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// vLLM's: `false` with `continue_final_message` continues the last assistant message.
    pub add_generation_prompt: Option<bool>,
    pub continue_final_message: Option<bool>,
    pub reasoning_effort: Option<String>,
    pub include_reasoning: Option<bool>,
    pub separate_reasoning: Option<bool>,
    pub stream_reasoning: Option<bool>,
    /// Documented as ignored (OpenAI's end-user id).
    pub user: Option<String>,
    pub response_format: Option<Value>,
    pub structured_outputs: Option<Value>,
    pub guided_json: Option<Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
    pub guided_decoding_backend: Option<String>,
    pub guided_whitespace_pattern: Option<String>,
    /// Accepted and ignored (docs/api.md lists them): fields OpenAI's SDKs send that change
    /// nothing Vigil computes.
    pub store: Option<bool>,
    pub metadata: Option<Value>,
    pub service_tier: Option<String>,
    pub prompt_cache_key: Option<String>,
    pub safety_identifier: Option<String>,
    pub verbosity: Option<String>,
    pub modalities: Option<Value>,
    /// OpenAI's predicted outputs: text the answer is expected to resemble, which speculative
    /// decoding drafts from.
    pub prediction: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
    pub name: Option<String>,
    pub tool_calls: Option<Vec<ToolCallIn>>,
    pub tool_call_id: Option<String>,
    pub reasoning: Option<String>,
    pub reasoning_content: Option<String>,
    /// Accepted and ignored (OpenAI's refusal echo).
    pub refusal: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "expected a string or an array of content parts ({\"type\": \"text\", \"text\": ...})"
)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub text: Option<String>,
    pub image_url: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCallIn {
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub function: FunctionCallIn,
    pub index: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionCallIn {
    pub name: String,
    pub arguments: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolDef {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub function: FunctionDef,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionDef {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<Value>,
    pub strict: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "expected \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}"
)]
pub enum ToolChoice {
    Mode(String),
    Named(NamedToolChoice),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedToolChoice {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: NamedFunction,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedFunction {
    pub name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompletionRequest {
    pub prompt: PromptField,
    pub model: Option<String>,
    pub max_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub logit_bias: Option<BTreeMap<String, f32>>,
    pub seed: Option<i64>,
    pub stop: Option<StopField>,
    pub n: Option<u32>,
    pub ignore_eos: Option<bool>,
    pub min_tokens: Option<u32>,
    /// Vigil's: speculative decoding for this request (`off`, `ngram`, `suffix`).
    pub speculative: Option<String>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub logprobs: Option<u32>,
    pub echo: Option<bool>,
    /// vLLM's: score the prompt, with this many top alternatives per position.
    pub prompt_logprobs: Option<u32>,
    pub suffix: Option<String>,
    pub best_of: Option<u32>,
    pub user: Option<String>,
    pub response_format: Option<Value>,
    pub structured_outputs: Option<Value>,
    pub guided_json: Option<Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
    pub guided_decoding_backend: Option<String>,
    pub guided_whitespace_pattern: Option<String>,
    /// Accepted and ignored, as on chat completions.
    pub store: Option<bool>,
    pub metadata: Option<Value>,
    pub service_tier: Option<String>,
    pub prompt_cache_key: Option<String>,
    pub safety_identifier: Option<String>,
}

/// A prompt as text or token ids (a batch of one is accepted in list form).
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "expected a string, an array of strings, an array of token ids or an array of token-id arrays"
)]
pub enum PromptField {
    Text(String),
    Tokens(Vec<u32>),
    TextBatch(Vec<String>),
    TokenBatch(Vec<Vec<u32>>),
}

/// Both request kinds carry the same sampling fields under the same names; serde cannot
/// flatten them into one struct while refusing unknown fields, so `common()` copies them.
macro_rules! impl_common_params {
    ($($request:ty),*) => {$(
        impl $request {
            pub fn common(&self) -> CommonParams {
                CommonParams {
                    temperature: self.temperature,
                    top_p: self.top_p,
                    top_k: self.top_k,
                    min_p: self.min_p,
                    presence_penalty: self.presence_penalty,
                    frequency_penalty: self.frequency_penalty,
                    repetition_penalty: self.repetition_penalty,
                    logit_bias: self.logit_bias.clone(),
                    seed: self.seed,
                    stop: self.stop.clone(),
                    n: self.n,
                    ignore_eos: self.ignore_eos,
                    min_tokens: self.min_tokens,
                    speculative: self.speculative.clone(),
                }
            }
        }
    )*};
}

impl_common_params!(ChatCompletionRequest, CompletionRequest);

macro_rules! impl_structured {
    ($($request:ty),*) => {$(
        impl $request {
            pub fn structured(&self) -> crate::structured::StructuredFields {
                crate::structured::StructuredFields {
                    response_format: self.response_format.clone(),
                    structured_outputs: self.structured_outputs.clone(),
                    guided_json: self.guided_json.clone(),
                    guided_regex: self.guided_regex.clone(),
                    guided_choice: self.guided_choice.clone(),
                    guided_grammar: self.guided_grammar.clone(),
                }
            }
        }
    )*};
}

impl_structured!(ChatCompletionRequest, CompletionRequest);
