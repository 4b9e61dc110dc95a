//! The model's reply text → what the APIs return: reasoning (`<think>`), content, tool calls.
//! Works incrementally for streams and in one go for whole replies.

use vigil_model::reasoning::{Delta, ReasoningStreamer};
use vigil_model::tool_parser::{
    call_suffix, forced_call_prefix, ToolArguments, ToolCallFormat, ToolCallStreamer,
};

#[derive(Debug, Clone, PartialEq)]
pub enum OutDelta {
    Reasoning(String),
    Content(String),
}

/// The content and reasoning text of a whole (non-streaming) generation.
#[derive(Debug, Default)]
pub struct CollectedText {
    pub content: String,
    pub reasoning: String,
}

impl CollectedText {
    pub fn push(&mut self, deltas: Vec<OutDelta>) {
        for d in deltas {
            match d {
                OutDelta::Content(s) => self.content.push_str(&s),
                OutDelta::Reasoning(s) => self.reasoning.push_str(&s),
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: ToolArguments,
}

impl ToolCall {
    /// OpenAI's `arguments`: compact JSON, or the raw text when it was not JSON.
    pub fn arguments_string(&self) -> String {
        self.arguments.to_json_string()
    }

    pub fn is_malformed(&self) -> bool {
        matches!(self.arguments, ToolArguments::Raw(_))
    }
}

/// A forced tool call: the prompt ends with the call's opening, so the output continues it.
#[derive(Debug, Clone)]
pub struct ForcedCall {
    /// The named function, or `None` for "any of the tools".
    pub name: Option<String>,
    /// Every offered tool's name (the choices when `name` is `None`).
    pub tool_names: Vec<String>,
}

impl ForcedCall {
    /// What the output must start with before the arguments object: nothing when the prompt
    /// named the function, else one of `NAME", "arguments": ` (in the format's own words).
    pub fn literals(&self, format: ToolCallFormat) -> Vec<String> {
        if self.name.is_some() {
            return Vec::new();
        }
        let open = forced_call_prefix(format, None);
        self.tool_names
            .iter()
            .filter_map(|n| {
                forced_call_prefix(format, Some(n))
                    .strip_prefix(open.as_str())
                    .map(str::to_string)
            })
            .collect()
    }
}

/// The names of tools in the chat template's shape (`[{"function": {"name": ...}}]`).
pub fn tool_names(tools: Option<&serde_json::Value>) -> Vec<String> {
    tools
        .and_then(|t| t.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|t| t.pointer("/function/name")?.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

pub struct OutputParser {
    reasoning: Option<ReasoningStreamer>,
    tools: Option<ToolCallStreamer>,
    /// A forced call's output stops when its arguments close; the call's closing is added.
    forced_suffix: Option<&'static str>,
}

impl OutputParser {
    /// `thinking`: `Some(starts_inside)` when the model may think; `tool_format`: parse tool
    /// calls in that format; `forced`: the output continues a forced call's opening.
    pub fn new(
        thinking: Option<bool>,
        tool_format: Option<ToolCallFormat>,
        forced: Option<&ForcedCall>,
    ) -> Self {
        let tools = tool_format.map(|f| match forced {
            Some(fc) => ToolCallStreamer::forced(f, fc.name.as_deref()),
            None => ToolCallStreamer::new(f),
        });
        OutputParser {
            reasoning: thinking.map(ReasoningStreamer::new),
            tools,
            forced_suffix: tool_format.filter(|_| forced.is_some()).map(call_suffix),
        }
    }

    pub fn push(&mut self, text: &str) -> Vec<OutDelta> {
        let mut out = Vec::new();
        let pieces = match &mut self.reasoning {
            Some(r) => r.push(text),
            None => vec![Delta::Content(text.to_string())],
        };
        self.route(pieces, &mut out);
        out
    }

    fn route(&mut self, pieces: Vec<Delta>, out: &mut Vec<OutDelta>) {
        for p in pieces {
            match p {
                Delta::Reasoning(s) => push_delta(out, OutDelta::Reasoning(s)),
                Delta::Content(s) => {
                    let c = match &mut self.tools {
                        Some(t) => t.push(&s),
                        None => s,
                    };
                    push_delta(out, OutDelta::Content(c));
                }
            }
        }
    }

    /// Ends the reply: what was held back, and the tool calls found.
    pub fn finish(&mut self) -> (Vec<OutDelta>, Vec<ToolCall>) {
        let mut out = Vec::new();
        if let Some(r) = self.reasoning.take() {
            let pieces = r.finish();
            self.route(pieces, &mut out);
        }
        let mut calls = Vec::new();
        if let Some(mut t) = self.tools.take() {
            if let Some(suffix) = self.forced_suffix {
                t.push(suffix);
            }
            let (rest, parsed) = t.finish();
            push_delta(&mut out, OutDelta::Content(rest));
            for c in parsed.calls {
                calls.push(ToolCall {
                    id: crate::ids::new_id("call_"),
                    name: c.name,
                    arguments: c.arguments,
                });
            }
        }
        (out, calls)
    }
}

fn push_delta(out: &mut Vec<OutDelta>, d: OutDelta) {
    match &d {
        OutDelta::Reasoning(s) | OutDelta::Content(s) if s.is_empty() => {}
        _ => out.push(d),
    }
}
