//! Tools on a model whose chat template has no tool-call format (SmolLM2's, say): instead of
//! dropping the tools, the conversation is rewritten into plain turns the template can render.
//! The offered tools and the call syntax go into the system message (the Hermes wording that
//! Qwen's templates use); earlier calls become `<tool_call>` text in their assistant turns and
//! tool results become user turns wrapped in `<tool_response>`. The output is then parsed, and a
//! forced call opened, in that same Hermes syntax (`ToolCallFormat::Hermes`).

use serde_json::{json, Value};

/// The system-message block that offers `tools` (OpenAI `{"type": "function", "function":
/// {...}}` entries) and says how to call them.
pub fn tools_block(tools: &[Value]) -> String {
    let mut s = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for t in tools {
        s.push('\n');
        s.push_str(&t.to_string());
    }
    s.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and \
         arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": \
         <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    s
}

fn text_of(m: &Value) -> String {
    m.get("content")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// Whether a conversation needs `rewrite`: tools offered, or calls and results in its history.
pub fn needed(messages: &Value, tools: Option<&Value>) -> bool {
    let offered = tools
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty());
    let in_history = (messages.as_array().into_iter().flatten())
        .any(|m| m.get("tool_calls").is_some() || m["role"] == "tool");
    offered || in_history
}

/// `messages` (the template's shape: an array of `{"role", "content", "tool_calls"?, ...}`)
/// with calls and results turned into text, and `tools` (if any) offered in the system
/// message. Other messages are kept as they are.
pub fn rewrite(messages: &Value, tools: Option<&Value>) -> Value {
    let list = messages.as_array().cloned().unwrap_or_default();
    let mut out: Vec<Value> = Vec::with_capacity(list.len() + 1);
    for m in list {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
        match role {
            "assistant" => {
                let mut text = text_of(&m);
                for c in m
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let f = &c["function"];
                    let call = json!({"name": f["name"], "arguments": f["arguments"]});
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&format!("<tool_call>\n{call}\n</tool_call>"));
                }
                let mut m = m;
                if let Some(o) = m.as_object_mut() {
                    o.remove("tool_calls");
                }
                m["content"] = json!(text);
                out.push(m);
            }
            "tool" => {
                let response = format!("<tool_response>\n{}\n</tool_response>", text_of(&m));
                // Consecutive results of one turn's calls share one user turn, as Qwen's
                // template renders them.
                match out.last_mut() {
                    Some(prev) if prev["role"] == "user" && prev["from_tools"] == true => {
                        let joined = format!("{}\n{response}", text_of(prev));
                        prev["content"] = json!(joined);
                    }
                    _ => out.push(json!({"role": "user", "content": response, "from_tools": true})),
                }
            }
            _ => out.push(m),
        }
    }
    for m in &mut out {
        if let Some(o) = m.as_object_mut() {
            o.remove("from_tools");
        }
    }
    if let Some(tools) = tools.and_then(Value::as_array).filter(|t| !t.is_empty()) {
        let block = tools_block(tools);
        match out.first_mut() {
            Some(first) if first["role"] == "system" => {
                let text = format!("{}\n\n{block}", text_of(first));
                first["content"] = json!(text.trim_start());
            }
            _ => out.insert(0, json!({"role": "system", "content": block})),
        }
    }
    Value::Array(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
    }

    #[test]
    fn tools_go_into_the_system_message_and_history_becomes_text() {
        let messages = json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Oslo and Rome?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
                {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}
            ]},
            {"role": "tool", "tool_call_id": "a", "content": "cold"},
            {"role": "tool", "tool_call_id": "b", "content": "warm"}
        ]);
        let out = rewrite(&messages, Some(&weather()));
        let out = out.as_array().unwrap();
        assert_eq!(out.len(), 4);
        let system = out[0]["content"].as_str().unwrap();
        assert!(system.starts_with("Be brief.\n\n# Tools"));
        assert!(system.contains(r#""name":"get_weather""#));
        assert_eq!(
            out[2]["content"],
            "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Rome\"}}\n</tool_call>"
        );
        assert_eq!(out[3]["role"], "user");
        assert_eq!(
            out[3]["content"],
            "<tool_response>\ncold\n</tool_response>\n<tool_response>\nwarm\n</tool_response>"
        );
        assert!(out
            .iter()
            .all(|m| m.get("tool_calls").is_none() && m.get("from_tools").is_none()));
    }

    #[test]
    fn without_a_system_message_one_is_added() {
        let out = rewrite(
            &json!([{"role": "user", "content": "hi"}]),
            Some(&weather()),
        );
        assert_eq!(out[0]["role"], "system");
        assert!(out[0]["content"].as_str().unwrap().starts_with("# Tools"));
        let none = rewrite(&json!([{"role": "user", "content": "hi"}]), None);
        assert_eq!(none, json!([{"role": "user", "content": "hi"}]));
    }
}
