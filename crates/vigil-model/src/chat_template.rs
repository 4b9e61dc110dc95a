//! Chat templates rendered with minijinja, byte-identical to HF transformers'
//! `apply_chat_template(..., tokenize=False)`.
//!
//! transformers renders with a sandboxed Jinja2 environment configured in
//! `transformers/utils/chat_template_utils.py`: `trim_blocks`, `lstrip_blocks`, loop controls,
//! a `tojson` filter that is plain `json.dumps` (no HTML escaping), and the globals
//! `raise_exception` and `strftime_now`. Templates also call Python methods on strings and
//! dicts (`.startswith`, `.split`, `.items()`), which minijinja-contrib's pycompat provides.
//! Before rendering, transformers drops `None` fields from messages and copies a message's
//! reasoning under both `reasoning_content` and `thinking`; `prepare_messages` does the same.

mod python;

pub use python::civil_from_days;

use minijinja::value::{Kwargs, Rest};
use minijinja::{Environment, Error, ErrorKind, State, Value};
use serde_json::{Map, Value as Json};

use crate::error::{ModelError, Result};

const TEMPLATE_NAME: &str = "chat_template";

/// Names a message's reasoning goes by; the first is what templates read.
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

fn template_err(e: Error) -> ModelError {
    // Show the whole chain: minijinja puts the template location in the source error.
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    ModelError::Template(msg)
}

impl ChatTemplate {
    /// Compiles `source`. `bos_token`/`eos_token` become the template variables of the same
    /// names, as transformers passes the tokenizer's special tokens.
    pub fn new(source: &str, bos_token: Option<&str>, eos_token: Option<&str>) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(python::format_value);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, rewrite_generation_tags(source))
            .map_err(template_err)?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.map(str::to_string),
            eos_token: eos_token.map(str::to_string),
        })
    }

    /// Renders `messages` (a JSON array of message objects). `tools` is the list of tool
    /// schemas; `kwargs` are extra template variables (`enable_thinking`, `documents`,
    /// `date_string`, ...), which override the special tokens like in transformers.
    pub fn render(
        &self,
        messages: &Json,
        tools: Option<&Json>,
        add_generation_prompt: bool,
        kwargs: &Map<String, Json>,
    ) -> Result<String> {
        let messages = prepare_messages(messages)?;
        let mut ctx = std::collections::BTreeMap::<String, Value>::new();
        for (name, token) in [
            ("bos_token", &self.bos_token),
            ("eos_token", &self.eos_token),
        ] {
            if let Some(token) = token {
                ctx.insert(name.to_string(), Value::from(token.as_str()));
            }
        }
        for (k, v) in kwargs {
            ctx.insert(k.clone(), Value::from_serialize(v));
        }
        // transformers always passes these three, `None` when absent, so `tools is defined`
        // holds even without tools.
        ctx.insert("messages".into(), Value::from_serialize(&messages));
        ctx.insert(
            "tools".into(),
            tools.map(Value::from_serialize).unwrap_or(Value::from(())),
        );
        let documents = kwargs.get("documents").filter(|d| !d.is_null());
        ctx.insert(
            "documents".into(),
            documents
                .map(Value::from_serialize)
                .unwrap_or(Value::from(())),
        );
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        );
        let template = self.env.get_template(TEMPLATE_NAME).map_err(template_err)?;
        template.render(ctx).map_err(template_err)
    }
}

/// transformers' `{% generation %}...{% endgeneration %}` only marks assistant text for
/// training masks and renders its body unchanged; minijinja has no such tag, so it becomes an
/// always-true `if` with the same whitespace control.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let (before, tag) = rest.split_at(start);
        out.push_str(before);
        let Some(end) = tag.find("%}") else {
            break;
        };
        let inner = tag.get(2..end).unwrap_or_default();
        // Whitespace-control markers (`-`/`+`) are single ASCII bytes, kept as they are.
        let open = match inner.starts_with(['-', '+']) {
            true => inner.get(..1).unwrap_or_default(),
            false => "",
        };
        let close = match inner.ends_with(['-', '+']) && inner.len() > open.len() {
            true => inner.get(inner.len() - 1..).unwrap_or_default(),
            false => "",
        };
        let word = inner
            .get(open.len()..inner.len() - close.len())
            .unwrap_or_default()
            .trim();
        match word {
            "generation" => out.push_str(&format!("{{%{open} if true {close}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{open} endif {close}%}}")),
            _ => out.push_str(tag.get(..end + 2).unwrap_or_default()),
        }
        rest = tag.get(end + 2..).unwrap_or_default();
    }
    out.push_str(rest);
    out
}

/// The messages as transformers hands them to the template: `None` fields dropped, reasoning
/// under every name templates read it by.
fn prepare_messages(messages: &Json) -> Result<Vec<Map<String, Json>>> {
    let list = messages
        .as_array()
        .ok_or_else(|| ModelError::Template("messages must be a JSON array".into()))?;
    list.iter()
        .map(|m| {
            let obj = m.as_object().ok_or_else(|| {
                ModelError::Template(format!("a message must be a JSON object, got {m}"))
            })?;
            let message: Map<String, Json> = obj
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let reasoning = REASONING_FIELDS
                .iter()
                .find_map(|f| message.get(*f))
                .cloned();
            Ok(match reasoning {
                // Python: {"thinking": r, **message, "reasoning_content": r}
                Some(r) => {
                    let mut aliased = Map::new();
                    aliased.insert("thinking".into(), r.clone());
                    aliased.extend(message);
                    aliased.insert("reasoning_content".into(), r);
                    aliased
                }
                None => message,
            })
        })
        .collect()
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, arguments positional or by name.
fn tojson(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<String, Error> {
    let names = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > names.len() {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            "tojson takes at most 4 arguments",
        ));
    }
    let mut opts: [Option<Value>; 4] = Default::default();
    for (slot, arg) in opts.iter_mut().zip(args.iter()) {
        *slot = Some(arg.clone());
    }
    for (slot, name) in opts.iter_mut().zip(names) {
        if let Some(v) = kwargs.get::<Option<Value>>(name)? {
            *slot = Some(v);
        }
    }
    kwargs.assert_all_used()?;
    let [ensure_ascii, indent, separators, sort_keys] = opts;
    let options = python::JsonOptions::new(
        ensure_ascii.is_some_and(|v| v.is_true()),
        indent.filter(|v| !v.is_none() && !v.is_undefined()),
        separators.filter(|v| !v.is_none() && !v.is_undefined()),
        sort_keys.is_some_and(|v| v.is_true()),
    )?;
    python::json_dumps(value, &options)
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `datetime.now().strftime(format)`, in UTC.
fn strftime_now(_state: &State, format: String) -> Result<String, Error> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    python::strftime(now.as_secs(), &format)
}
