//! Output parsers: reasoning split, tool calls (Hermes, Llama 3 JSON) and the incremental JSON
//! validator. Real cases come from the chat-template fixture (tests/fixtures/chat_template),
//! whose expected prompts transformers rendered: the assistant turns in them are exactly what a
//! model trained on the template outputs. Every streamer is checked against its one-shot parse
//! at every split point.

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Map, Value};
use vigil_model::json_prefix::{JsonPrefix, JsonStatus};
use vigil_model::reasoning::{
    prompt_leaves_thinking_open, split_reasoning, Delta, ReasoningStreamer,
};
use vigil_model::tool_parser::{
    call_suffix, forced_call_prefix, parse, parse_forced, ParsedOutput, ParsedToolCall,
    ToolArguments, ToolCallFormat, ToolCallStreamer,
};

use ToolCallFormat::{Hermes, Llama3Json};

fn fixture() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/chat_template/chat_templates.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// (case name, messages, rendered prompt) of the fixture's cases for `template`.
fn cases(fx: &Value, template: &str) -> Vec<(String, Vec<Value>, String)> {
    let all = fx["cases"].as_array().cloned().unwrap_or_default();
    all.into_iter()
        .filter(|c| c["template"] == template)
        .filter_map(|c| {
            let expected = c["expected"].as_str()?.to_string();
            let messages = c["messages"].as_array()?.clone();
            Some((c["name"].as_str()?.to_string(), messages, expected))
        })
        .collect()
}

/// The text of every finished assistant turn in a rendered prompt.
fn assistant_turns<'a>(prompt: &'a str, header: &str, ends: &[&str]) -> Vec<&'a str> {
    prompt
        .split(header)
        .skip(1)
        .filter_map(|turn| {
            let end = ends.iter().filter_map(|e| turn.find(e)).min()?;
            Some(&turn[..end])
        })
        .collect()
}

fn call(name: &str, arguments: Value) -> ParsedToolCall {
    ParsedToolCall {
        name: name.to_string(),
        arguments: ToolArguments::Json(arguments),
    }
}

/// A message's `tool_calls` as the parser should read them back.
fn expected_calls(message: &Value) -> Vec<ParsedToolCall> {
    let calls = message["tool_calls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    calls
        .iter()
        .map(|c| {
            let f = &c["function"];
            let args = match &f["arguments"] {
                Value::String(s) => serde_json::from_str(s).unwrap_or_else(|e| panic!("{s}: {e}")),
                v => v.clone(),
            };
            call(f["name"].as_str().unwrap_or_default(), args)
        })
        .collect()
}

/// Every way to cut `text` in two at a char boundary, plus one char at a time.
fn splits(text: &str) -> Vec<Vec<&str>> {
    let mut all: Vec<Vec<&str>> = text
        .char_indices()
        .map(|(i, _)| i)
        .chain([text.len()])
        .map(|i| vec![&text[..i], &text[i..]])
        .collect();
    let mut chars = Vec::new();
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        chars.push(&rest[..c.len_utf8()]);
        rest = &rest[c.len_utf8()..];
    }
    all.push(chars);
    all
}

/// Streams `text` through a `ToolCallStreamer` in every split and compares with `parse`.
fn check_tool_stream(format: ToolCallFormat, text: &str) -> ParsedOutput {
    let whole = parse(format, text);
    for pieces in splits(text) {
        let mut streamer = ToolCallStreamer::new(format);
        let mut content = String::new();
        for piece in &pieces {
            content.push_str(&streamer.push(piece));
        }
        let (tail, parsed) = streamer.finish();
        content.push_str(&tail);
        assert_eq!(
            content, whole.content,
            "{format:?} streamed content, pieces {pieces:?}"
        );
        assert_eq!(parsed, whole, "{format:?} stream finish, pieces {pieces:?}");
    }
    whole
}

/// Streams `text` through a `ReasoningStreamer` in every split and compares with
/// `split_reasoning`.
fn check_reasoning_stream(text: &str, starts_in_thinking: bool) -> (Option<String>, String) {
    let whole = split_reasoning(text, starts_in_thinking);
    for pieces in splits(text) {
        let mut streamer = ReasoningStreamer::new(starts_in_thinking);
        let mut deltas = Vec::new();
        for piece in &pieces {
            deltas.extend(streamer.push(piece));
        }
        deltas.extend(streamer.finish());
        let (mut reasoning, mut content) = (String::new(), String::new());
        for d in &deltas {
            match d {
                Delta::Reasoning(s) => {
                    assert!(content.is_empty(), "reasoning after content: {deltas:?}");
                    reasoning.push_str(s);
                }
                Delta::Content(s) => content.push_str(s),
            }
            assert!(!matches!(d, Delta::Reasoning(s) | Delta::Content(s) if s.is_empty()));
        }
        let ctx = format!("{text:?} (in thinking: {starts_in_thinking}), pieces {pieces:?}");
        assert_eq!(
            reasoning,
            whole.0.clone().unwrap_or_default(),
            "reasoning of {ctx}"
        );
        assert_eq!(content, whole.1, "content of {ctx}");
    }
    whole
}

#[test]
fn detects_formats_of_fixture_templates() {
    let fx = fixture();
    let source = |name: &str| {
        fx["templates"][name]["source"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(ToolCallFormat::detect(&source("qwen3")), Some(Hermes));
    assert_eq!(
        ToolCallFormat::detect(&source("llama3_1")),
        Some(Llama3Json)
    );
    assert_eq!(ToolCallFormat::detect(&source("llama3_1_npm")), None);
    assert_eq!(ToolCallFormat::detect(&source("smollm2")), None);
}

#[test]
fn qwen3_rendered_assistant_turns_parse_back() {
    let fx = fixture();
    let (mut with_calls, mut with_reasoning) = (0, 0);
    for (name, messages, prompt) in cases(&fx, "qwen3") {
        let assistants: Vec<&Value> = messages
            .iter()
            .filter(|m| m["role"] == "assistant")
            .collect();
        let turns = assistant_turns(&prompt, "<|im_start|>assistant\n", &["<|im_end|>"]);
        assert_eq!(turns.len(), assistants.len(), "{name}: assistant turns");
        for (turn, message) in turns.iter().zip(assistants) {
            let (reasoning, content) = check_reasoning_stream(turn, false);
            let parsed = check_tool_stream(Hermes, &content);
            let calls = expected_calls(message);
            assert_eq!(parsed.calls, calls, "{name}: calls in {turn:?}");
            assert_eq!((parsed.malformed, parsed.recovered), (0, 0), "{name}");
            // The template shows the text after any `</think>`, without leading newlines.
            let raw = message["content"].as_str().unwrap_or_default();
            let visible = raw.rsplit("</think>").next().unwrap_or_default();
            assert_eq!(
                parsed.content,
                visible.trim_start_matches('\n'),
                "{name}: content"
            );
            if let Some(r) = &reasoning {
                let given = message["reasoning_content"].as_str().map(str::to_string);
                let in_tags = raw
                    .split("</think>")
                    .next()
                    .map(|s| s.replace("<think>", ""));
                let given = given.or(in_tags).unwrap_or_default();
                assert_eq!(r, given.trim_matches('\n'), "{name}: reasoning");
                with_reasoning += 1;
            }
            with_calls += usize::from(!calls.is_empty());
        }
    }
    assert!(
        with_calls >= 3 && with_reasoning >= 3,
        "{with_calls} {with_reasoning}"
    );
}

#[test]
fn llama3_rendered_assistant_turns_parse_back() {
    let fx = fixture();
    let mut with_calls = 0;
    let header = "<|start_header_id|>assistant<|end_header_id|>\n\n";
    for (name, messages, prompt) in cases(&fx, "llama3_1") {
        let assistants: Vec<&Value> = messages
            .iter()
            .filter(|m| m["role"] == "assistant")
            .collect();
        let turns = assistant_turns(&prompt, header, &["<|eot_id|>", "<|eom_id|>"]);
        assert_eq!(turns.len(), assistants.len(), "{name}: assistant turns");
        for (turn, message) in turns.iter().zip(assistants) {
            let parsed = check_tool_stream(Llama3Json, turn);
            if turn.starts_with("<|python_tag|>") {
                // Built-in tools are called in Python syntax, which is not JSON: plain text.
                assert!(parsed.calls.is_empty(), "{name}");
                assert_eq!(parsed.content, *turn);
                continue;
            }
            let calls = expected_calls(message);
            assert_eq!(parsed.calls, calls, "{name}: calls in {turn:?}");
            let text = message["content"].as_str().unwrap_or_default().trim();
            let content = if calls.is_empty() { text } else { "" };
            assert_eq!(parsed.content, content, "{name}");
            with_calls += usize::from(!calls.is_empty());
        }
    }
    assert!(with_calls >= 1);
}

#[test]
fn thinking_left_open_by_prompt() {
    let fx = fixture();
    let prompt = |case: &str| {
        cases(&fx, "qwen3")
            .into_iter()
            .find(|c| c.0 == case)
            .map(|c| c.2)
            .unwrap_or_else(|| panic!("no case {case}"))
    };
    // `enable_thinking: false` closes an empty section in the prompt; history sections close.
    assert!(prompt("thinking_off").ends_with("<think>\n\n</think>\n\n"));
    assert!(!prompt_leaves_thinking_open(&prompt("thinking_off")));
    assert!(!prompt_leaves_thinking_open(&prompt("thinking_on")));
    assert!(!prompt_leaves_thinking_open(&prompt(
        "reasoning_content_in_history"
    )));
    let open = prompt("reasoning_content_in_history") + "<|im_start|>assistant\n<think>\n";
    assert!(prompt_leaves_thinking_open(&open));
}

#[test]
fn reasoning_split_cases() {
    let some = |s: &str| Some(s.to_string());
    let cases: &[(&str, bool, Option<String>, &str)] = &[
        (
            "<think>\nStep one.\n\nStep two.\n</think>\n\nAnswer.\n",
            false,
            some("Step one.\n\nStep two."),
            "Answer.\n",
        ),
        ("  \n<think>\nx\n</think>\n\ny", false, some("x"), "y"),
        ("<think>\n\n</think>\n\nHi", false, None, "Hi"),
        (
            "<think>\nCut off while thinking\n",
            false,
            some("Cut off while thinking"),
            "",
        ),
        (
            "Plain answer with <think> later",
            false,
            None,
            "Plain answer with <think> later",
        ),
        ("\n\nPlain", false, None, "\n\nPlain"),
        (
            "<think>a </thinking> <think> b</think>c",
            false,
            some("a </thinking> <think> b"),
            "c",
        ),
        ("<thinking>not a tag", false, None, "<thinking>not a tag"),
        (
            "Thinking from the prompt.\n</think>\n\nAnswer",
            true,
            some("Thinking from the prompt."),
            "Answer",
        ),
        (
            "<think>\nReopened.\n</think>\n\nAnswer",
            true,
            some("Reopened."),
            "Answer",
        ),
        ("\nStill thinking", true, some("Still thinking"), ""),
        ("</think>\n\nNo thoughts", true, None, "No thoughts"),
        ("", true, None, ""),
        ("", false, None, ""),
        ("<thi", false, None, "<thi"),
        ("<thi", true, some("<thi"), ""),
        ("思考 😀\n</think>\n\n答え", true, some("思考 😀"), "答え"),
    ];
    for (text, in_thinking, reasoning, content) in cases {
        let got = check_reasoning_stream(text, *in_thinking);
        assert_eq!(got, (reasoning.clone(), content.to_string()), "{text:?}");
    }
}

#[test]
fn reasoning_streams_before_the_section_closes() {
    let mut s = ReasoningStreamer::new(false);
    assert_eq!(
        s.push("<think>\nFirst"),
        vec![Delta::Reasoning("First".into())]
    );
    assert_eq!(
        s.push(" thought.\n"),
        vec![Delta::Reasoning(" thought.".into())]
    );
    assert!(s.in_reasoning());
    assert_eq!(s.push("</thi"), vec![]);
    assert_eq!(s.push("nk>\n\nOk"), vec![Delta::Content("Ok".into())]);
    assert!(!s.in_reasoning());
    assert_eq!(s.finish(), vec![]);
}

#[test]
fn hermes_cases() {
    let weather = json!({"location": "Paris", "unit": "celsius"});
    let a = r#"<tool_call>
{"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}}
</tool_call>"#;
    let b = r#"<tool_call>
{"name": "search", "arguments": {"query": "\"Lyon\" événements"}}
</tool_call>"#;
    let two = format!("Checking.\n{a}\n{b}\nTrailing text is dropped.");
    let parsed = check_tool_stream(Hermes, &two);
    assert_eq!(parsed.content, "Checking.");
    let search = call("search", json!({"query": "\"Lyon\" événements"}));
    assert_eq!(
        parsed.calls,
        vec![call("get_weather", weather.clone()), search.clone()]
    );
    assert_eq!(
        parsed.calls[1].arguments.to_json_string(),
        r#"{"query":"\"Lyon\" événements"}"#
    );

    // Generation stopped right after the JSON; a closing tag forgotten before the next call.
    let unterminated = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, 2]}}\n";
    let parsed = check_tool_stream(Hermes, unterminated);
    assert_eq!(
        (parsed.calls, parsed.recovered),
        (vec![call("f", json!({"a": [1, 2]}))], 0)
    );
    let unclosed = format!("{}\n{b}", &a[..a.len() - "\n</tool_call>".len()]);
    let parsed = check_tool_stream(Hermes, &unclosed);
    assert_eq!(
        parsed.calls,
        vec![call("get_weather", weather.clone()), search]
    );

    // Other spellings: `parameters`, arguments as a JSON string, no arguments.
    let spelled = "<tool_call>\n{\"name\": \"f\", \"parameters\": {\"x\": 1}}\n</tool_call>\n\
        <tool_call>\n{\"name\": \"g\", \"arguments\": \"{\\\"y\\\": true}\"}\n</tool_call>\n\
        <tool_call>\n{\"name\": \"h\"}\n</tool_call>";
    let parsed = check_tool_stream(Hermes, spelled);
    let want = vec![
        call("f", json!({"x": 1})),
        call("g", json!({"y": true})),
        call("h", json!({})),
    ];
    assert_eq!((parsed.content.as_str(), parsed.calls), ("", want));
}

#[test]
fn hermes_broken_calls() {
    let recovered = |text: &str| {
        let parsed = check_tool_stream(Hermes, text);
        assert_eq!(
            (parsed.calls.len(), parsed.recovered, parsed.malformed),
            (1, 1, 0),
            "{text:?}"
        );
        parsed.calls[0].clone()
    };
    // The outer brace is missing, but the arguments are whole.
    let c = recovered("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}\n</tool_call>");
    assert_eq!(c, call("f", json!({"a": 1})));
    // Invalid arguments stay raw, without the call's closing brace.
    let c = recovered("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1,}}\n</tool_call>");
    assert_eq!(c.arguments, ToolArguments::Raw("{\"a\": 1,}".into()));
    assert_eq!(c.arguments.to_json_string(), "{\"a\": 1,}");
    assert_eq!(c.arguments.into_value(), json!("{\"a\": 1,}"));
    // Cut off inside the arguments.
    let c =
        recovered("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Par");
    assert_eq!(
        c.arguments,
        ToolArguments::Raw("{\"location\": \"Par".into())
    );

    // No name: dropped; with no call left, the output is plain content.
    let garbage = "Let me see.\n<tool_call>\nget_weather(Paris)\n</tool_call>";
    let parsed = check_tool_stream(Hermes, garbage);
    assert_eq!(
        (
            parsed.content.as_str(),
            parsed.calls.len(),
            parsed.malformed
        ),
        (garbage, 0, 1)
    );
    let not_a_call = "<tool_call>\n[\"get_weather\"]\n</tool_call>";
    assert_eq!(check_tool_stream(Hermes, not_a_call).malformed, 1);
    let mixed = format!(
        "Hi\n{garbage}\n<tool_call>\n{{\"name\": \"f\", \"arguments\": {{}}}}\n</tool_call>"
    );
    let parsed = check_tool_stream(Hermes, &mixed);
    assert_eq!(
        (parsed.content.as_str(), parsed.calls, parsed.malformed),
        ("Hi\nLet me see.", vec![call("f", json!({}))], 1)
    );
}

#[test]
fn hermes_streams_content_until_the_call() {
    let mut s = ToolCallStreamer::new(Hermes);
    assert_eq!(s.push("Let me"), "Let me");
    assert_eq!(s.push(" check.\n"), " check.");
    assert_eq!(s.push("\n<tool"), "");
    assert_eq!(s.push("box> is"), "\n\n<toolbox> is");
    assert_eq!(s.push(" ok.\n<tool_"), " ok.");
    assert!(!s.in_call());
    assert_eq!(
        s.push("call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"),
        ""
    );
    assert!(s.in_call());
    let (tail, parsed) = s.finish();
    assert_eq!(tail, "");
    assert_eq!(parsed.content, "Let me check.\n\n<toolbox> is ok.");
    assert_eq!(parsed.calls, vec![call("f", json!({}))]);
    // Whitespace held for a call that never comes is returned at the end.
    let mut s = ToolCallStreamer::new(Hermes);
    assert_eq!(s.push("Done.\n"), "Done.");
    assert_eq!(s.finish().0, "\n");
}

#[test]
fn llama3_cases() {
    let one = r#"<|python_tag|>{"name": "get_weather", "parameters": {"location": "Paris"}}"#;
    let parsed = check_tool_stream(Llama3Json, one);
    assert_eq!(
        (parsed.content.as_str(), parsed.calls),
        ("", vec![call("get_weather", json!({"location": "Paris"}))])
    );

    let several = r#"
{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {}}
{"name": "c", "parameters": {"s": "é\n"}}
"#;
    let parsed = check_tool_stream(Llama3Json, several);
    let want = vec![
        call("a", json!({"x": 1})),
        call("b", json!({})),
        call("c", json!({"s": "é\n"})),
    ];
    assert_eq!(parsed.calls, want);

    for plain in [
        "The weather is fine.",
        "  {not json",
        "{\"answer\": 42}",
        "[1, 2]",
        "<|python_tag|",
    ] {
        let parsed = check_tool_stream(Llama3Json, plain);
        assert_eq!(
            parsed,
            ParsedOutput {
                content: plain.into(),
                ..Default::default()
            }
        );
    }
    // Tagged output is a call attempt even when it is broken.
    let parsed = check_tool_stream(Llama3Json, "<|python_tag|>{\"answer\": 42}");
    assert_eq!((parsed.calls.len(), parsed.malformed), (0, 1));
    let cut = "{\"name\": \"f\", \"parameters\": {\"q\": \"abc";
    let parsed = check_tool_stream(Llama3Json, cut);
    let raw = ParsedToolCall {
        name: "f".into(),
        arguments: ToolArguments::Raw("{\"q\": \"abc".into()),
    };
    assert_eq!((parsed.calls, parsed.recovered), (vec![raw], 1));

    let mut s = ToolCallStreamer::new(Llama3Json);
    assert_eq!(s.push(" "), "");
    assert_eq!(s.push("Sure"), " Sure");
    assert_eq!(s.push(" {\"name\""), " {\"name\"");
    assert!(!s.in_call());
}

#[test]
fn forced_calls() {
    let generated = "{\"location\": \"Paris\"}}\n</tool_call>";
    assert_eq!(
        forced_call_prefix(Hermes, Some("get_weather")),
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
    );
    assert_eq!(
        forced_call_prefix(Hermes, None),
        "<tool_call>\n{\"name\": \""
    );
    assert_eq!(
        forced_call_prefix(Llama3Json, Some("f")),
        "{\"name\": \"f\", \"parameters\": "
    );
    assert_eq!(forced_call_prefix(Llama3Json, None), "{\"name\": \"");
    let weather = vec![call("get_weather", json!({"location": "Paris"}))];
    assert_eq!(
        parse_forced(Hermes, Some("get_weather"), generated).calls,
        weather
    );
    let named_by_model = "get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n</tool_call>";
    assert_eq!(parse_forced(Hermes, None, named_by_model).calls, weather);
    let llama = "{\"location\": \"Paris\"}}";
    assert_eq!(
        parse_forced(Llama3Json, Some("get_weather"), llama).calls,
        weather
    );
    assert_eq!(
        parse_forced(
            Llama3Json,
            None,
            "get_weather\", \"parameters\": {\"location\": \"Paris\"}}"
        )
        .calls,
        weather
    );
    // A name that JSON must escape survives the round trip.
    let odd = "say \"hi\"\\";
    assert_eq!(
        parse_forced(Hermes, Some(odd), "{}}").calls,
        vec![call(odd, json!({}))]
    );

    // The engine's loop: arguments constrained by JsonPrefix, then the suffix jumped to.
    for format in [Hermes, Llama3Json] {
        let args = "{\"location\": \"Paris\", \"days\": [1, 2e0]}";
        let mut json = JsonPrefix::new();
        let mut streamer = ToolCallStreamer::forced(format, Some("get_weather"));
        for (i, c) in args.char_indices() {
            let status = json.push(c);
            let want = if i + 1 == args.len() {
                JsonStatus::Complete
            } else {
                JsonStatus::Incomplete
            };
            assert_eq!(status, want, "{format:?} after {:?}", &args[..=i]);
            assert_eq!(streamer.push(&args[i..i + c.len_utf8()]), "");
        }
        assert_eq!(streamer.push(call_suffix(format)), "");
        let (tail, parsed) = streamer.finish();
        assert_eq!(tail, "");
        let want = call(
            "get_weather",
            json!({"location": "Paris", "days": [1, 2.0]}),
        );
        assert_eq!(
            (parsed.calls, parsed.recovered),
            (vec![want], 0),
            "{format:?}"
        );
    }
}

fn json_status(text: &str) -> JsonStatus {
    JsonPrefix::new().push_str(text)
}

/// serde_json's verdict, or `None` for an error this validator does not model.
fn serde_accepts(text: &str) -> Option<bool> {
    match serde_json::from_str::<Value>(text) {
        Ok(_) => Some(true),
        Err(e) if e.to_string().contains("number out of range") => None,
        Err(_) => Some(false),
    }
}

/// Asserts that every prefix of a valid document is a prefix to the validator, and Complete
/// exactly when serde_json accepts it.
fn check_valid_document(doc: &str) {
    let mut json = JsonPrefix::new();
    for (i, c) in doc.char_indices() {
        let status = json.push(c);
        let prefix = &doc[..i + c.len_utf8()];
        assert_ne!(status, JsonStatus::Invalid, "{prefix:?} of {doc:?}");
        assert_eq!(
            status == JsonStatus::Complete,
            serde_json::from_str::<Value>(prefix).is_ok(),
            "{prefix:?}"
        );
    }
    assert_eq!(json.status(), JsonStatus::Complete, "{doc:?}");
}

#[test]
fn json_prefix_hand_cases() {
    let valid = [
        "0",
        "-0",
        "-0.5e+3",
        "1E5",
        "12.25e-7",
        "true",
        "null",
        "\"\"",
        "[]",
        "{}",
        " [ ] ",
        "\"\\/\\b\\f\\n\\r\\t\\\\\\\"\"",
        "\"\\u00e9\\uD83D\\ude00 é 😀 \u{7f}\"",
        "[[[]],{}]",
        "{\"a\": {\"b\": [1, -2, 3.5, false, null]}, \"\": \"\"}",
        "\n{\r\"k\"\t:\n1}\n",
    ];
    for doc in valid {
        check_valid_document(doc);
    }
    let invalid = [
        "{\"a\" 1}",
        "[1,]",
        "{,}",
        "01",
        "1.",
        "-",
        ".5",
        "1e",
        "+1",
        "\"\\x\"",
        "\"\\u12G4\"",
        "\"\\ud800\"",
        "\"\\ud800\\u0041\"",
        "\"\\udc00\"",
        "\"a\u{1}b\"",
        "tru",
        "nul l",
        "[1 2]",
        "{\"a\":1}}",
        "{\"a\":1} x",
        "]",
        "{\"a\":}",
        "{1:2}",
        "[}",
        "{]",
        "\"abc",
        "{\"a\":1,}",
        "true false",
        "'a'",
        "NaN",
        "[-]",
        "{\"a\"}",
    ];
    for doc in invalid {
        assert_eq!(
            serde_accepts(doc),
            Some(false),
            "serde_json accepts {doc:?}"
        );
        assert_ne!(json_status(doc), JsonStatus::Complete, "{doc:?}");
    }
    assert_eq!(json_status("[1 2]"), JsonStatus::Invalid);
    assert_eq!(json_status("\"\\ud800\\u0041"), JsonStatus::Invalid);
    assert_eq!(json_status("{\"a\": [1, {\"b\""), JsonStatus::Incomplete);

    let nested = |n: usize| "[".repeat(n) + &"]".repeat(n);
    assert_eq!(
        json_status(&nested(JsonPrefix::DEFAULT_MAX_DEPTH)),
        JsonStatus::Complete
    );
    assert_eq!(
        json_status(&nested(JsonPrefix::DEFAULT_MAX_DEPTH + 1)),
        JsonStatus::Invalid
    );
    let deep = JsonPrefix::with_max_depth(500).push_str(&nested(JsonPrefix::MAX_DEPTH));
    assert_eq!(deep, JsonStatus::Complete);
    assert_eq!(
        JsonPrefix::with_max_depth(2).push_str("{\"a\": [{}]}"),
        JsonStatus::Invalid
    );

    // Once invalid, always invalid; a top-level number stays open to more digits.
    let mut json = JsonPrefix::new();
    assert_eq!(json.push_str("12"), JsonStatus::Complete);
    let mut longer = json;
    assert_eq!(longer.push_str("3 "), JsonStatus::Complete);
    assert_eq!(json.push_str("x"), JsonStatus::Invalid);
    assert_eq!(json.push_str(" "), JsonStatus::Invalid);
}

const STRING_CHARS: &[char] = &[
    'a', 'Z', ' ', '"', '\\', '/', '\n', '\t', '\u{1}', '\u{1f}', '\u{7f}', 'é', '東', '😀', '{',
    ':',
];

fn random_string(rng: &mut ChaCha8Rng) -> String {
    let len = rng.random_range(0..6);
    (0..len)
        .map(|_| STRING_CHARS[rng.random_range(0..STRING_CHARS.len())])
        .collect()
}

fn random_value(rng: &mut ChaCha8Rng, depth: u32) -> Value {
    if depth > 0 && rng.random_bool(0.6) {
        let len = rng.random_range(0..5);
        return if rng.random_bool(0.5) {
            Value::Array((0..len).map(|_| random_value(rng, depth - 1)).collect())
        } else {
            let mut map = Map::new();
            for _ in 0..len {
                map.insert(random_string(rng), random_value(rng, depth - 1));
            }
            Value::Object(map)
        };
    }
    match rng.random_range(0..6) {
        0 => Value::Null,
        1 => Value::Bool(rng.random()),
        2 => json!(rng.random_range(-1000i64..1000)),
        3 => match rng.random_range(0..3) {
            0 => json!(rng.random::<i64>()),
            1 => json!(rng.random::<u64>()),
            _ => json!(f64::from_bits(rng.random::<u64>())),
        },
        4 => json!((rng.random::<f64>() - 0.5) * 10f64.powi(rng.random_range(-12..12))),
        _ => Value::String(random_string(rng)),
    }
}

/// Python's `ensure_ascii` form: non-ASCII characters (only ever inside strings) as `\u`
/// escapes, surrogate pairs beyond the BMP.
fn ascii_escaped(doc: &str) -> String {
    let mut out = String::new();
    for c in doc.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            for unit in c.encode_utf16(&mut [0; 2]) {
                out.push_str(&format!("\\u{unit:04X}"));
            }
        }
    }
    out
}

const MUTATION_CHARS: &[char] = &[
    '{', '}', '[', ']', ':', ',', '"', '\\', ' ', '0', '7', '.', 'e', '-', '+', 't', 'n', 'u', 'x',
    '\u{1}', 'é',
];

fn mutate(rng: &mut ChaCha8Rng, doc: &str) -> String {
    let mut chars: Vec<char> = doc.chars().collect();
    let at = rng.random_range(0..=chars.len());
    let pick = |rng: &mut ChaCha8Rng| MUTATION_CHARS[rng.random_range(0..MUTATION_CHARS.len())];
    match rng.random_range(0..5) {
        0 if at < chars.len() => {
            chars.remove(at);
        }
        1 if at < chars.len() => chars[at] = pick(rng),
        2 => chars.truncate(at),
        3 => {
            let end = rng.random_range(at..=chars.len());
            let copy: Vec<char> = chars[at..end].to_vec();
            chars.splice(at..at, copy);
        }
        _ => chars.insert(at, pick(rng)),
    }
    chars.into_iter().collect()
}

#[test]
fn json_prefix_agrees_with_serde_json_on_random_documents() {
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed);
    let (mut rejected, mut checked) = (0, 0);
    for _ in 0..400 {
        let value = random_value(&mut rng, 4);
        let compact = value.to_string();
        let pretty = serde_json::to_string_pretty(&value).unwrap_or_else(|e| panic!("{e}"));
        for doc in [ascii_escaped(&compact), pretty, compact] {
            check_valid_document(&doc);
            for _ in 0..10 {
                let mutated = mutate(&mut rng, &doc);
                let Some(accepted) = serde_accepts(&mutated) else {
                    continue;
                };
                let status = json_status(&mutated);
                assert_eq!(
                    status == JsonStatus::Complete,
                    accepted,
                    "{mutated:?} from {doc:?}"
                );
                rejected += usize::from(!accepted);
                checked += 1;
            }
        }
    }
    // The mutations must exercise rejection, not only harmless edits.
    assert!(
        rejected > checked / 4,
        "{rejected} of {checked} mutations rejected"
    );
}
