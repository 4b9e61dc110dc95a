//! Output parsers: reasoning split and tool calls (Hermes, Llama 3 JSON). Real cases come from
//! the chat-template fixture (tests/fixtures/chat_template), whose expected prompts transformers
//! rendered: the assistant turns in them are exactly what a model trained on the template
//! outputs. Every streamer is checked against its one-shot parse
//! at every split point.

use std::path::Path;

use serde_json::{json, Value};
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

    // The engine's loop: the arguments object character by character (its grammar ends the
    // sequence there), then the suffix jumped to.
    for format in [Hermes, Llama3Json] {
        let args = "{\"location\": \"Paris\", \"days\": [1, 2e0]}";
        let mut streamer = ToolCallStreamer::forced(format, Some("get_weather"));
        for (i, c) in args.char_indices() {
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
