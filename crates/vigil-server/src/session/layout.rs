//! How session text is laid out in the chat template (see docs/sessions.md): the opening (the
//! template up to an open user turn, with the session `prompt` as the system message), the
//! data entries inside that turn, and a question completing the turn followed by the
//! generation prompt. The pieces come from real template renders, so every template (ChatML,
//! Llama 3, ...) lays a session out the way it lays out a chat: two renders that differ only in
//! the user message's one-character content share exactly the text before and after it. No
//! marker is searched for, so nothing a client writes can move the cut.

use super::state::Layout;
use crate::error::ApiError;
use crate::state::AppState;
use serde_json::{json, Map, Value};

/// The text a question is wrapped in.
#[derive(Debug, Clone, Default)]
pub struct QuestionText {
    pub before: String,
    pub after: String,
}

fn render(
    state: &AppState,
    messages: Value,
    gen: bool,
    kwargs: &Map<String, Value>,
) -> Result<String, ApiError> {
    let Some(t) = &state.template else {
        return Ok(String::new());
    };
    t.render(&messages, None, gen, kwargs).map_err(|e| {
        ApiError::internal(format!("the chat template failed on a session layout: {e}"))
    })
}

fn messages(system: Option<&str>, user: &str) -> Value {
    let mut m = Vec::new();
    if let Some(s) = system {
        m.push(json!({"role": "system", "content": s}));
    }
    m.push(json!({"role": "user", "content": user}));
    Value::Array(m)
}

/// The opening and the turn's closing (generation prompt included): the common prefix and
/// suffix of two renders whose user contents are two different single characters.
fn split_turn(
    state: &AppState,
    system: Option<&str>,
    kwargs: &Map<String, Value>,
) -> Result<(String, String), ApiError> {
    if state.template.is_none() {
        let head = system.map(|s| format!("{s}\n")).unwrap_or_default();
        return Ok((head, "\n".into()));
    }
    let a = render(state, messages(system, "A"), true, kwargs)?;
    let b = render(state, messages(system, "B"), true, kwargs)?;
    let head = common_prefix(&a, &b);
    let tail = common_suffix(&a[head..], &b[head..]);
    // Each render holds its content between the two: exactly one character, or the template
    // does not place the user message verbatim.
    if a.len() != head + 1 + tail || b.len() != head + 1 + tail {
        return Err(ApiError::internal(
            "the chat template does not place the user message verbatim",
        ));
    }
    Ok((a[..head].to_string(), a[a.len() - tail..].to_string()))
}

/// Bytes `a` and `b` share at their start, ending on a character boundary.
fn common_prefix(a: &str, b: &str) -> usize {
    (a.char_indices().zip(b.chars()))
        .find(|((_, x), y)| x != y)
        .map_or(a.len().min(b.len()), |((i, _), _)| i)
}

/// Bytes `a` and `b` share at their end, starting on a character boundary.
fn common_suffix(a: &str, b: &str) -> usize {
    (a.chars().rev().zip(b.chars().rev()))
        .take_while(|(x, y)| x == y)
        .map(|(x, _)| x.len_utf8())
        .sum()
}

/// The opening of a session: everything before its first data entry.
pub fn opening(state: &AppState, prompt: Option<&str>) -> Result<String, ApiError> {
    Ok(split_turn(state, prompt, &Map::new())?.0)
}

/// What opens a new user turn after a closed one (`<|im_start|>user\n` in ChatML).
fn turn_head(state: &AppState) -> Result<String, ApiError> {
    if state.template.is_none() {
        return Ok(String::new());
    }
    let sys = "s";
    let closed = render(
        state,
        json!([{"role": "system", "content": sys}]),
        false,
        &Map::new(),
    )?;
    let (head, _) = split_turn(state, Some(sys), &Map::new())?;
    Ok(head
        .strip_prefix(&closed)
        .map(str::to_string)
        .unwrap_or_else(|| "\n".into()))
}

/// The text before data entries when the context is at `layout` (empty inside a data turn).
pub fn data_prefix(state: &AppState, layout: Layout) -> Result<String, ApiError> {
    match layout {
        Layout::Data => Ok(String::new()),
        Layout::Chat => turn_head(state),
    }
}

/// How a question is placed after a context at `layout`; `kwargs` are the question's thinking
/// settings (they change the generation prompt).
pub fn question(
    state: &AppState,
    layout: Layout,
    prompt: Option<&str>,
    kwargs: &Map<String, Value>,
) -> Result<QuestionText, ApiError> {
    let (_, after) = split_turn(state, prompt, kwargs)?;
    Ok(QuestionText {
        before: data_prefix(state, layout)?,
        after,
    })
}

/// A session's question wrappings with the default template settings, one per layout: built
/// once when the session is created (on the tokenizer pool), so answering a question renders
/// nothing.
#[derive(Debug, Clone, Default)]
pub struct Wraps {
    pub data: QuestionText,
    pub chat: QuestionText,
}

impl Wraps {
    pub fn build(state: &AppState, prompt: Option<&str>) -> Result<Wraps, ApiError> {
        let none = Map::new();
        Ok(Wraps {
            data: question(state, Layout::Data, prompt, &none)?,
            chat: question(state, Layout::Chat, prompt, &none)?,
        })
    }

    pub fn at(&self, layout: Layout) -> &QuestionText {
        match layout {
            Layout::Data => &self.data,
            Layout::Chat => &self.chat,
        }
    }
}

/// Whether `kwargs` leave the generation prompt as it is by default (shortcuts allowed).
pub fn default_generation_prompt(
    state: &AppState,
    prompt: Option<&str>,
    kwargs: &Map<String, Value>,
) -> bool {
    if kwargs.is_empty() {
        return true;
    }
    let with = split_turn(state, prompt, kwargs).map(|t| t.1);
    let without = split_turn(state, prompt, &Map::new()).map(|t| t.1);
    matches!((with, without), (Ok(a), Ok(b)) if a == b)
}
