//! The model's reply text → what the APIs return: reasoning (`<think>`), content, tool calls.
//! Works incrementally for streams and in one go for whole replies.

use vigil_model::reasoning::{Delta, ReasoningStreamer};
use vigil_model::tool_parser::{ToolArguments, ToolCallFormat, ToolCallStreamer};

#[derive(Debug, Clone, PartialEq)]
pub enum OutDelta {
    Reasoning(String),
    Content(String),
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
    pub name: Option<String>,
}

pub struct OutputParser {
    reasoning: Option<ReasoningStreamer>,
    tools: Option<ToolCallStreamer>,
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
        if let Some(t) = self.tools.take() {
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
