//! Chat templates render byte-identically to HF transformers' `apply_chat_template`.
//! Fixture: tests/fixtures/chat_template/chat_templates.json, made by
//! scripts/make_chat_template_fixtures.py (templates included, so no env var is needed).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::{Map, Value};
use vigil_model::chat_template::ChatTemplate;

#[derive(Deserialize)]
struct Fixture {
    templates: BTreeMap<String, TemplateSpec>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct TemplateSpec {
    source: String,
    /// The tokenizer's special tokens map, which transformers passes as template variables.
    special_tokens: Map<String, Value>,
}

#[derive(Deserialize)]
struct Case {
    template: String,
    name: String,
    messages: Value,
    tools: Option<Value>,
    add_generation_prompt: bool,
    kwargs: Map<String, Value>,
    expected: Option<String>,
    error: Option<String>,
}

fn fixture() -> Fixture {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/chat_template/chat_templates.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn renders_like_transformers() {
    let fx = fixture();
    let mut compiled = BTreeMap::new();
    for (name, spec) in &fx.templates {
        let token = |k: &str| spec.special_tokens.get(k).and_then(Value::as_str);
        let template = ChatTemplate::new(&spec.source, token("bos_token"), token("eos_token"))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        // The other special tokens (pad_token, ...) reach the template as variables too.
        let extra: Map<String, Value> = spec
            .special_tokens
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "bos_token" | "eos_token"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        compiled.insert(name.clone(), (template, extra));
    }
    let mut failures = Vec::new();
    for case in &fx.cases {
        let (template, extra) = &compiled[&case.template];
        let mut kwargs = extra.clone();
        kwargs.extend(case.kwargs.clone());
        let got = template.render(
            &case.messages,
            case.tools.as_ref(),
            case.add_generation_prompt,
            &kwargs,
        );
        let what = format!("{} / {}", case.template, case.name);
        match (&case.expected, got) {
            (Some(want), Ok(got)) if *want == got => {}
            (Some(want), Ok(got)) => {
                failures.push(format!("{what}:\n--- want\n{want}\n--- got\n{got}\n---"))
            }
            (Some(_), Err(e)) => failures.push(format!("{what}: error {e}")),
            (None, Err(_)) => {}
            (None, Ok(got)) => failures.push(format!(
                "{what}: transformers raised {:?}, we rendered:\n{got}",
                case.error
            )),
        }
    }
    assert!(fx.cases.len() >= 25, "too few cases");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

fn render(source: &str, messages: Value) -> Result<String, String> {
    ChatTemplate::new(source, Some("<s>"), Some("</s>"))
        .and_then(|t| t.render(&messages, None, false, &Map::new()))
        .map_err(|e| e.to_string())
}

#[test]
fn raise_exception_is_an_error_with_its_message() {
    let err = render(
        "{{ raise_exception('only user and assistant roles') }}",
        serde_json::json!([]),
    )
    .unwrap_err();
    assert!(err.contains("only user and assistant roles"), "{err}");
}

#[test]
fn syntax_errors_are_reported_at_compile_time() {
    assert!(ChatTemplate::new("{% for m in messages %}", None, None).is_err());
}

#[test]
fn messages_must_be_an_array_of_objects() {
    assert!(render("{{ messages }}", serde_json::json!({"role": "user"})).is_err());
    assert!(render("{{ messages }}", serde_json::json!(["hi"])).is_err());
}

#[test]
fn python_semantics_of_printing_and_tojson() {
    let messages = serde_json::json!([{"role": "user", "content": "x", "n": null}]);
    let cases = [
        (
            "{{ none }}|{{ true }}|{{ 1.5e-7 }}|{{ [1, 'a', none] }}",
            "None|True|1.5e-07|[1, 'a', None]",
        ),
        ("{{ {'k': \"it's\"} }}", "{'k': \"it's\"}"),
        (
            "{{ messages[0] | tojson }}",
            r#"{"role": "user", "content": "x"}"#,
        ),
        (
            "{{ 'é<&>' | tojson }}|{{ 'é' | tojson(ensure_ascii=true) }}",
            r#""é<&>"|"\u00e9""#,
        ),
        (
            "{{ {'b': 1, 'a': [1, 2]} | tojson(sort_keys=true, separators=(',', ':')) }}",
            r#"{"a":[1,2],"b":1}"#,
        ),
        ("{{ {'a': []} | tojson(indent=2) }}", "{\n  \"a\": []\n}"),
        (
            "{{ 'a,b'.split(',') | join('-') }}{{ '  x '.strip() }}{{ 'ab'.startswith('a') }}",
            "a-bxTrue",
        ),
        (
            "{% for k, v in {'x': 1}.items() %}{{ k }}={{ v }}{% endfor %}",
            "x=1",
        ),
        ("{{ strftime_now('%Y') | length }}", "4"),
    ];
    for (source, want) in cases {
        assert_eq!(
            render(source, messages.clone()).as_deref(),
            Ok(want),
            "{source}"
        );
    }
}

#[test]
fn generation_tags_render_their_body() {
    let source = "{% for m in messages %}\n  {%- generation -%}\n  [{{ m.content }}]\n  {%- endgeneration %}\n{% endfor %}";
    let got = render(
        source,
        serde_json::json!([{"content": "a"}, {"content": "b"}]),
    );
    assert_eq!(got.as_deref(), Ok("[a][b]"));
}
