//! Anthropic Messages request bodies. Content blocks stay JSON values and are checked by hand
//! so that every error names its block (`messages[2].content[1].type`).

use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessagesRequest {
    pub model: Option<String>,
    pub messages: Vec<InputMessage>,
    /// Required by `/v1/messages`, ignored by `count_tokens`.
    pub max_tokens: Option<u64>,
    pub system: Option<Value>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub seed: Option<i64>,
    pub ignore_eos: Option<bool>,
    pub stop_sequences: Option<Vec<String>>,
    pub stream: Option<bool>,
    pub tools: Option<Vec<ToolDef>>,
    pub tool_choice: Option<ToolChoice>,
    pub thinking: Option<Thinking>,
    pub output_config: Option<OutputConfig>,
    pub metadata: Option<Value>,
    /// Accepted and ignored: one tier here.
    pub service_tier: Option<String>,
    /// Accepted and ignored: every prompt's prefix is cached automatically.
    pub cache_control: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputMessage {
    pub role: String,
    pub content: Value,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolDef {
    pub name: String,
    pub description: Option<String>,
    pub input_schema: Option<Value>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub cache_control: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolChoice {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: Option<String>,
    pub disable_parallel_tool_use: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Thinking {
    #[serde(rename = "type")]
    pub kind: String,
    pub budget_tokens: Option<u64>,
    pub display: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputConfig {
    pub effort: Option<String>,
    pub format: Option<Value>,
}
