//! How session text is laid out in the chat template (see docs/sessions.md): the opening (the
//! template up to an open user turn, with the session `prompt` as the system message), the
//! data entries inside that turn, and a question completing the turn followed by the
//! generation prompt. The pieces are cut out of real template renders around a marker, so
//! every template (ChatML, Llama 3, ...) lays a session out the way it lays out a chat.

use super::state::Layout;
use crate::error::ApiError;
use crate::state::AppState;
use serde_json::{json, Map, Value};

const MARK: &str = "\u{1}VIGIL-SESSION-MARK\u{1}";

/// The text a question is wrapped in.
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

/// The opening and the turn's closing (generation prompt included), cut around the marker.
fn split_turn(
    state: &AppState,
    system: Option<&str>,
    kwargs: &Map<String, Value>,
) -> Result<(String, String), ApiError> {
    if state.template.is_none() {
        let head = system.map(|s| format!("{s}\n")).unwrap_or_default();
        return Ok((head, "\n".into()));
    }
    // The marker must not occur in the client's own text, or the cut would land inside it.
    let mut mark = MARK.to_string();
    let taken = |m: &str| system.is_some_and(|s| s.contains(m)) || kwargs_contain(kwargs, m);
    while taken(&mark) {
        mark.push('\u{1}');
    }
    let text = render(state, messages(system, &mark), true, kwargs)?;
    match text.split_once(mark.as_str()) {
        Some((head, tail)) => Ok((head.to_string(), tail.to_string())),
        None => Err(ApiError::internal(
            "the chat template drops the user message",
        )),
    }
}

fn kwargs_contain(kwargs: &Map<String, Value>, needle: &str) -> bool {
    kwargs.values().any(|v| v.to_string().contains(needle))
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
