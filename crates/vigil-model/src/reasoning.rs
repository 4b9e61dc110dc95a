//! Splits a reasoning model's `<think>...</think>` section (Qwen3 style) from its answer, in one
//! shot or while streaming.
//!
//! The model either opens the section itself (`<think>` at the start of its output) or the chat
//! template already wrote `<think>` into the prompt, so the output starts inside the section
//! ("starts in thinking"). The template writes the section as `<think>\n{reasoning}\n</think>\n\n`
//! and the answer after it, so the reasoning is returned without those newlines and the answer
//! without its leading ones. `<think>` counts only at the start of the output: the same text
//! later in an answer is part of the answer.

pub const THINK_START: &str = "<think>";
pub const THINK_END: &str = "</think>";

/// Splits `text` into (reasoning, content). Reasoning is `None` when there is none, or when the
/// section is empty. A section the output never closes (generation stopped while thinking) is
/// all reasoning.
pub fn split_reasoning(text: &str, starts_in_thinking: bool) -> (Option<String>, String) {
    let body = match text.trim_start().strip_prefix(THINK_START) {
        Some(body) => body,
        None if starts_in_thinking => text,
        None => return (None, text.to_string()),
    };
    let (reasoning, content) = match body.find(THINK_END) {
        Some(i) => (
            &body[..i],
            body[i + THINK_END.len()..].trim_start_matches('\n'),
        ),
        None => (body, ""),
    };
    let reasoning = reasoning.trim_matches('\n');
    let reasoning = (!reasoning.is_empty()).then(|| reasoning.to_string());
    (reasoning, content.to_string())
}

/// Whether a rendered prompt leaves a `<think>` section open, so that the output starts in
/// thinking: its last `<think>` comes after its last `</think>`.
pub fn prompt_leaves_thinking_open(prompt: &str) -> bool {
    match (prompt.rfind(THINK_START), prompt.rfind(THINK_END)) {
        (Some(start), Some(end)) => start > end,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// A piece of streamed output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    Reasoning(String),
    Content(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing decided: only whitespace or part of `<think>` seen.
    Start,
    Reasoning,
    /// Just after `</think>`: the newlines before the answer are dropped.
    AfterReasoning,
    Content,
}

/// Incremental [`split_reasoning`]: the concatenated deltas equal its result, and no delta holds
/// a partial tag. Text that may be the start of a tag, or newlines that may be the ones around
/// it, is held until the next delta decides.
#[derive(Debug, Clone)]
pub struct ReasoningStreamer {
    starts_in_thinking: bool,
    phase: Phase,
    /// Received and not yet emitted.
    pending: String,
    /// Some reasoning was emitted, so further leading newlines are part of it.
    reasoning_started: bool,
}

impl ReasoningStreamer {
    pub fn new(starts_in_thinking: bool) -> Self {
        ReasoningStreamer {
            starts_in_thinking,
            phase: Phase::Start,
            pending: String::new(),
            reasoning_started: false,
        }
    }

    /// Whether the stream is inside the reasoning section (or may still open one).
    pub fn in_reasoning(&self) -> bool {
        matches!(self.phase, Phase::Start | Phase::Reasoning)
    }

    pub fn push(&mut self, delta: &str) -> Vec<Delta> {
        self.pending.push_str(delta);
        let mut out = Vec::new();
        loop {
            match self.phase {
                Phase::Start => {
                    let lead = self.pending.trim_start();
                    if let Some(body) = lead.strip_prefix(THINK_START) {
                        self.pending = body.to_string();
                        self.phase = Phase::Reasoning;
                    } else if THINK_START.starts_with(lead) {
                        return out;
                    } else if self.starts_in_thinking {
                        self.phase = Phase::Reasoning;
                    } else {
                        self.phase = Phase::Content;
                    }
                }
                Phase::Reasoning => {
                    if let Some(i) = self.pending.find(THINK_END) {
                        let rest = self.pending.split_off(i);
                        let reasoning = std::mem::replace(&mut self.pending, rest);
                        self.emit_reasoning(reasoning.trim_end_matches('\n'), &mut out);
                        self.pending.drain(..THINK_END.len());
                        self.phase = Phase::AfterReasoning;
                        continue;
                    }
                    let tag_start =
                        self.pending.len() - held_tag_prefix_len(&self.pending, THINK_END);
                    let end = self.pending[..tag_start].trim_end_matches('\n').len();
                    let held = self.pending.split_off(end);
                    let reasoning = std::mem::replace(&mut self.pending, held);
                    self.emit_reasoning(&reasoning, &mut out);
                    return out;
                }
                Phase::AfterReasoning => {
                    let answer_start =
                        self.pending.len() - self.pending.trim_start_matches('\n').len();
                    self.pending.drain(..answer_start);
                    if self.pending.is_empty() {
                        return out;
                    }
                    self.phase = Phase::Content;
                }
                Phase::Content => {
                    if !self.pending.is_empty() {
                        out.push(Delta::Content(std::mem::take(&mut self.pending)));
                    }
                    return out;
                }
            }
        }
    }

    /// Ends the stream: emits what was held back.
    pub fn finish(mut self) -> Vec<Delta> {
        let mut out = Vec::new();
        match self.phase {
            Phase::Start => {
                let (reasoning, content) = split_reasoning(&self.pending, self.starts_in_thinking);
                out.extend(reasoning.map(Delta::Reasoning));
                if !content.is_empty() {
                    out.push(Delta::Content(content));
                }
            }
            Phase::Reasoning => {
                let held = std::mem::take(&mut self.pending);
                self.emit_reasoning(held.trim_end_matches('\n'), &mut out);
            }
            Phase::AfterReasoning | Phase::Content => {}
        }
        out
    }

    fn emit_reasoning(&mut self, text: &str, out: &mut Vec<Delta>) {
        let text = if self.reasoning_started {
            text
        } else {
            text.trim_start_matches('\n')
        };
        if !text.is_empty() {
            self.reasoning_started = true;
            out.push(Delta::Reasoning(text.to_string()));
        }
    }
}

/// Length of the longest proper prefix of `tag` that `text` ends with: text that may become the
/// tag once more arrives. Tags are ASCII, so the cut is on a char boundary.
pub(crate) fn held_tag_prefix_len(text: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&k| text.ends_with(&tag[..k]))
        .unwrap_or(0)
}
