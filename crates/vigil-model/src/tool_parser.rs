//! Tool calls in model output, for the formats the chat templates teach:
//! * Hermes (Qwen3, Qwen2.5, Hermes), one block per call after optional text:
//!   `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`;
//! * Llama 3.x JSON: the whole output, after an optional `<|python_tag|>`, is
//!   `{"name": ..., "parameters": {...}}`, several separated by `;` or newlines.
//!
//! Parsing never fails: a call whose JSON is broken is recovered when its name can be read (the
//! arguments then stay raw text unless they parse on their own), and dropped otherwise. An
//! output in which no call survives is plain content, markup included, so nothing is lost.

use serde_json::{Deserializer, Map, Value};

use crate::reasoning::held_tag_prefix_len;

pub const TOOL_CALL_START: &str = "<tool_call>";
pub const TOOL_CALL_END: &str = "</tool_call>";
pub const PYTHON_TAG: &str = "<|python_tag|>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallFormat {
    Hermes,
    Llama3Json,
}

impl ToolCallFormat {
    /// Guesses the format a chat template teaches its model, or `None` for a template without
    /// tool calling.
    pub fn detect(chat_template_source: &str) -> Option<Self> {
        let src = chat_template_source;
        if src.contains(TOOL_CALL_START) {
            Some(ToolCallFormat::Hermes)
        } else if src.contains(PYTHON_TAG)
            || (src.contains("\"parameters\"") && src.contains("ipython"))
        {
            Some(ToolCallFormat::Llama3Json)
        } else {
            None
        }
    }

    /// The key the format names a call's arguments with.
    fn arguments_key(self) -> &'static str {
        match self {
            ToolCallFormat::Hermes => "arguments",
            ToolCallFormat::Llama3Json => "parameters",
        }
    }
}

/// A call's arguments: parsed JSON, or the model's text when it is not valid JSON.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolArguments {
    Json(Value),
    Raw(String),
}

impl ToolArguments {
    /// OpenAI's `arguments` string: compact JSON, or the raw text.
    pub fn to_json_string(&self) -> String {
        match self {
            ToolArguments::Json(v) => v.to_string(),
            ToolArguments::Raw(s) => s.clone(),
        }
    }

    /// Anthropic's `input`: the parsed value, or the raw text as a JSON string.
    pub fn into_value(self) -> Value {
        match self {
            ToolArguments::Json(v) => v,
            ToolArguments::Raw(s) => Value::String(s),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ParsedToolCall {
    pub name: String,
    pub arguments: ToolArguments,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParsedOutput {
    /// With calls, the text before the first one (trailing whitespace dropped); without, the
    /// whole output.
    pub content: String,
    pub calls: Vec<ParsedToolCall>,
    /// Call attempts dropped because no name could be read.
    pub malformed: usize,
    /// Calls read from invalid JSON.
    pub recovered: usize,
}

impl ParsedOutput {
    fn plain(text: &str) -> Self {
        ParsedOutput {
            content: text.to_string(),
            ..Default::default()
        }
    }

    fn add(&mut self, attempt: CallAttempt) {
        match attempt {
            CallAttempt::Parsed(call) => self.calls.push(call),
            CallAttempt::Recovered(call) => {
                self.recovered += 1;
                self.calls.push(call);
            }
            CallAttempt::Malformed => self.malformed += 1,
        }
    }

    /// Sets the content from the text before the first call, or the whole output without calls.
    fn with_content(mut self, text: &str, before_calls: &str) -> Self {
        self.content = if self.calls.is_empty() {
            text
        } else {
            before_calls.trim_end()
        }
        .to_string();
        self
    }
}

/// Reads the tool calls in a finished output.
pub fn parse(format: ToolCallFormat, text: &str) -> ParsedOutput {
    match format {
        ToolCallFormat::Hermes => parse_hermes(text),
        ToolCallFormat::Llama3Json => parse_llama3(text),
    }
}

/// The opening of a forced call, which goes at the end of the prompt: with a `name` the call to
/// that function up to its arguments, without (`tool_choice: required`) up to the name.
pub fn forced_call_prefix(format: ToolCallFormat, name: Option<&str>) -> String {
    let open = match format {
        ToolCallFormat::Hermes => "<tool_call>\n",
        ToolCallFormat::Llama3Json => "",
    };
    match name {
        Some(name) => {
            let name = Value::String(name.to_string());
            format!("{open}{{\"name\": {name}, \"{}\": ", format.arguments_key())
        }
        None => format!("{open}{{\"name\": \""),
    }
}

/// What closes a call after its arguments.
pub fn call_suffix(format: ToolCallFormat) -> &'static str {
    match format {
        ToolCallFormat::Hermes => "}\n</tool_call>",
        ToolCallFormat::Llama3Json => "}",
    }
}

/// Parses the output of a forced call: `generated` continues [`forced_call_prefix`].
pub fn parse_forced(format: ToolCallFormat, name: Option<&str>, generated: &str) -> ParsedOutput {
    parse(format, &(forced_call_prefix(format, name) + generated))
}

enum CallAttempt {
    Parsed(ParsedToolCall),
    Recovered(ParsedToolCall),
    Malformed,
}

fn parse_hermes(text: &str) -> ParsedOutput {
    let Some(first) = text.find(TOOL_CALL_START) else {
        return ParsedOutput::plain(text);
    };
    let mut out = ParsedOutput::default();
    let mut rest = &text[first..];
    while let Some(start) = rest.find(TOOL_CALL_START) {
        let body = &rest[start + TOOL_CALL_START.len()..];
        // A block ends at its closing tag, at the next block (a forgotten closing tag) or at the
        // end of the output (generation stopped after the JSON).
        let end = [body.find(TOOL_CALL_END), body.find(TOOL_CALL_START)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(body.len());
        out.add(parse_call_object(&body[..end]));
        rest = &body[end..];
    }
    out.with_content(text, &text[..first])
}

fn parse_llama3(text: &str) -> ParsedOutput {
    let lead = text.trim_start();
    let tagged = lead.starts_with(PYTHON_TAG);
    let mut rest = lead.strip_prefix(PYTHON_TAG).unwrap_or(lead).trim_start();
    if !rest.starts_with('{') {
        return ParsedOutput::plain(text);
    }
    let mut out = ParsedOutput::default();
    loop {
        rest = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
        if rest.is_empty() {
            break;
        }
        let mut values = Deserializer::from_str(rest).into_iter::<Value>();
        match values.next() {
            Some(Ok(value)) => {
                out.add(call_attempt(value));
                rest = &rest[values.byte_offset()..];
            }
            _ => {
                out.add(recover_call(rest));
                break;
            }
        }
    }
    // Untagged JSON that holds no call is an answer that happens to be JSON.
    if out.calls.is_empty() && !tagged {
        return ParsedOutput::plain(text);
    }
    out.with_content(text, "")
}

/// One call's JSON object, as the model wrote it.
fn parse_call_object(body: &str) -> CallAttempt {
    match serde_json::from_str::<Value>(body.trim()) {
        Ok(value) => call_attempt(value),
        Err(_) => recover_call(body),
    }
}

/// A valid JSON value is a call when it is an object with a string `name`.
fn call_attempt(value: Value) -> CallAttempt {
    match value {
        Value::Object(map) => {
            call_from_object(map).map_or(CallAttempt::Malformed, CallAttempt::Parsed)
        }
        _ => CallAttempt::Malformed,
    }
}

fn call_from_object(mut map: Map<String, Value>) -> Option<ParsedToolCall> {
    let Some(Value::String(name)) = map.remove("name") else {
        return None;
    };
    let arguments = map
        .remove("arguments")
        .or_else(|| map.remove("parameters"))
        .map_or(
            ToolArguments::Json(Value::Object(Map::new())),
            arguments_from_value,
        );
    Some(ParsedToolCall { name, arguments })
}

/// Arguments written as a JSON string holding JSON (OpenAI's wire form) are unwrapped.
fn arguments_from_value(value: Value) -> ToolArguments {
    match value {
        Value::String(s) => match serde_json::from_str(&s) {
            Ok(v) => ToolArguments::Json(v),
            Err(_) => ToolArguments::Raw(s),
        },
        v => ToolArguments::Json(v),
    }
}

/// Reads a call out of invalid JSON: the name and arguments values where they parse, the
/// arguments' raw text where they do not.
fn recover_call(body: &str) -> CallAttempt {
    let Some((Value::String(name), _)) = after_key(body, "name").and_then(leading_value) else {
        return CallAttempt::Malformed;
    };
    let arguments = match after_key(body, "arguments").or_else(|| after_key(body, "parameters")) {
        None => ToolArguments::Json(Value::Object(Map::new())),
        Some(text) => match leading_value(text) {
            Some((value, _)) => arguments_from_value(value),
            None => {
                // The call object's own closing brace is not part of the arguments.
                let text = text.trim_end();
                ToolArguments::Raw(
                    text.strip_suffix('}')
                        .unwrap_or(text)
                        .trim_end()
                        .to_string(),
                )
            }
        },
    };
    CallAttempt::Recovered(ParsedToolCall { name, arguments })
}

/// The text after the first `"key":` in `body`, whitespace skipped.
fn after_key<'a>(body: &'a str, key: &str) -> Option<&'a str> {
    let quoted = format!("\"{key}\"");
    let mut from = 0;
    while let Some(i) = body[from..].find(&quoted) {
        from += i + quoted.len();
        if let Some(value) = body[from..].trim_start().strip_prefix(':') {
            return Some(value.trim_start());
        }
    }
    None
}

/// The JSON value at the start of `text` and the byte length it spans.
fn leading_value(text: &str) -> Option<(Value, usize)> {
    let mut values = Deserializer::from_str(text).into_iter::<Value>();
    match values.next() {
        Some(Ok(value)) => Some((value, values.byte_offset())),
        _ => None,
    }
}

/// Streams the content of an output that may end in tool calls: [`push`](Self::push) returns
/// content as soon as it cannot be the start of a call, and [`finish`](Self::finish) parses the
/// calls. Whitespace is held until more text follows, since it is dropped before a call.
#[derive(Debug, Clone)]
pub struct ToolCallStreamer {
    format: ToolCallFormat,
    text: String,
    /// Bytes of `text` returned as content.
    emitted: usize,
    /// A call has started: the rest is buffered for `finish`.
    in_call: bool,
    /// (Llama 3) the output is known not to start with a call.
    plain: bool,
}

impl ToolCallStreamer {
    pub fn new(format: ToolCallFormat) -> Self {
        ToolCallStreamer {
            format,
            text: String::new(),
            emitted: 0,
            in_call: false,
            plain: false,
        }
    }

    /// A streamer for an output that continues [`forced_call_prefix`].
    pub fn forced(format: ToolCallFormat, name: Option<&str>) -> Self {
        let mut streamer = Self::new(format);
        streamer.text = forced_call_prefix(format, name);
        streamer.in_call = true;
        streamer
    }

    /// Whether a tool call has started.
    pub fn in_call(&self) -> bool {
        self.in_call
    }

    /// Adds a delta of output; returns the content that is now certain (possibly empty).
    pub fn push(&mut self, delta: &str) -> String {
        self.text.push_str(delta);
        if self.in_call {
            return String::new();
        }
        let end = match self.format {
            ToolCallFormat::Hermes => self.hermes_content_end(),
            ToolCallFormat::Llama3Json => self.llama3_content_end(),
        };
        if end <= self.emitted {
            return String::new();
        }
        let content = self.text[self.emitted..end].to_string();
        self.emitted = end;
        content
    }

    /// Ends the stream: the content not yet returned by `push`, and the whole parse (equal to
    /// [`parse`] of everything pushed).
    pub fn finish(self) -> (String, ParsedOutput) {
        let parsed = parse(self.format, &self.text);
        let tail = parsed
            .content
            .get(self.emitted..)
            .unwrap_or_default()
            .to_string();
        (tail, parsed)
    }

    fn hermes_content_end(&mut self) -> usize {
        // A tag cannot start inside emitted text: a partial one would have been held back.
        let unsent = &self.text[self.emitted..];
        let before_call = match unsent.find(TOOL_CALL_START) {
            Some(i) => {
                self.in_call = true;
                &unsent[..i]
            }
            None => &unsent[..unsent.len() - held_tag_prefix_len(unsent, TOOL_CALL_START)],
        };
        self.emitted + before_call.trim_end().len()
    }

    fn llama3_content_end(&mut self) -> usize {
        if self.plain {
            return self.text.len();
        }
        let lead = self.text.trim_start();
        if PYTHON_TAG.starts_with(lead) {
            return 0;
        }
        let body = lead.strip_prefix(PYTHON_TAG).unwrap_or(lead).trim_start();
        if body.is_empty() {
            0
        } else if body.starts_with('{') {
            self.in_call = true;
            0
        } else {
            self.plain = true;
            self.text.len()
        }
    }
}
