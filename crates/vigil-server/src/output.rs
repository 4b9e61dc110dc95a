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
    /// Every offered tool: its name and its parameters' JSON schema (`{"type": "object"}`
    /// when it gives none).
    pub tools: Vec<(String, serde_json::Value)>,
}

impl ForcedCall {
    /// `tools` in the chat template's shape (`[{"function": {"name", "parameters"}}]`).
    pub fn new(name: Option<String>, tools: Option<&serde_json::Value>) -> Self {
        let tools = (tools.and_then(|t| t.as_array()).into_iter().flatten())
            .filter_map(|t| {
                let f = t.get("function")?;
                let name = f.get("name")?.as_str()?.to_string();
                let schema = (f.get("parameters").cloned())
                    .filter(|p| p.is_object())
                    .unwrap_or_else(|| serde_json::json!({"type": "object"}));
                Some((name, schema))
            })
            .collect();
        ForcedCall { name, tools }
    }

    /// What the output after the prompt's opening must be: the arguments object under the
    /// named tool's schema; or, for any tool, one of `NAME", "arguments": ` (in the format's
    /// own words) followed by that tool's arguments.
    pub fn grammar(&self, format: ToolCallFormat) -> vigil_engine::grammar::GrammarSpec {
        use vigil_engine::grammar::{compact_json, GrammarSpec};
        let object = serde_json::json!({"type": "object"});
        if let Some(name) = &self.name {
            let schema = (self.tools.iter())
                .find(|(n, _)| n == name)
                .map_or(object, |(_, s)| s.clone());
            return GrammarSpec::JsonSchema(schema);
        }
        let open = forced_call_prefix(format, None);
        let mut rules = Vec::new();
        let mut alts = Vec::new();
        for (i, (name, schema)) in self.tools.iter().enumerate() {
            let Some(literal) = forced_call_prefix(format, Some(name))
                .strip_prefix(open.as_str())
                .map(str::to_string)
            else {
                continue;
            };
            let quoted = serde_json::to_string(&literal).unwrap_or_default();
            rules.push(format!("call_{i}: {quoted} %json {}", compact_json(schema)));
            alts.push(format!("call_{i}"));
        }
        GrammarSpec::Lark(format!("start: {}\n{}", alts.join(" | "), rules.join("\n")))
    }
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
