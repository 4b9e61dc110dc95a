//! Request bodies parsed strictly: invalid JSON, wrong types and unknown fields become a 400
//! naming the field (its JSON path) and, in JSON's terms, the shape it takes; a body over the
//! limit is a 413, in the route's envelope.

use crate::error::{ApiError, Flavor};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

pub fn parse_body<T: DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
    flavor: Flavor,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|rej| {
        let status = rej.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "request body is larger than the server's limit (--max-body-bytes)",
            )
        } else {
            ApiError::bad_request(format!("could not read the request body: {rej}"))
        }
        .with_flavor(flavor)
    })?;
    parse_json(&bytes).map_err(|e| e.with_flavor(flavor))
}

pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(ApiError::bad_request(
            "the request body is empty; expected a JSON object",
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let result: Result<T, _> = serde_path_to_error::deserialize(&mut de);
    let value = result.map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            return ApiError::bad_request(format!("invalid JSON in the request body: {inner}"));
        }
        let msg = describe(&inner);
        let param = if path == "." {
            unknown_field_name(&msg).unwrap_or_default()
        } else {
            path
        };
        if param.is_empty() {
            ApiError::bad_request(format!("invalid request: {msg}"))
        } else {
            ApiError::invalid(param.clone(), format!("invalid `{param}`: {msg}"))
        }
    })?;
    de.end()
        .map_err(|e| ApiError::bad_request(format!("invalid JSON in the request body: {e}")))?;
    Ok(value)
}

/// A body's type error as a client reads it: no position, JSON's words (`json_terms`).
pub(crate) fn describe(err: &serde_json::Error) -> String {
    json_terms(&strip_position(&err.to_string()))
}

/// serde_json appends " at line L column C", which means nothing to an HTTP client.
fn strip_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg.to_string(),
    }
}

/// serde's words for a type in JSON's: a client sent an array or an object, not a `sequence`
/// or a `map`, and Rust's names (`struct ChatMessage`, `u32`) mean nothing to it.
fn json_terms(msg: &str) -> String {
    // serde reads a struct from an array too; when the array is too short, it says so.
    if msg.starts_with("invalid length ") && msg.contains(", expected struct ") {
        return "invalid type: array, expected an object".to_string();
    }
    let mut out = msg
        .replace("invalid type: sequence", "invalid type: array")
        .replace("invalid type: map", "invalid type: object")
        .replace("invalid type: floating point", "invalid type: number")
        .replace("invalid value: floating point", "invalid value: number")
        .replace("expected a sequence", "expected an array")
        .replace("expected a map", "expected an object");
    for (rust, json) in [
        ("expected struct ", "expected an object"),
        ("expected internally tagged enum ", "expected an object"),
        ("expected adjacently tagged enum ", "expected an object"),
        ("expected enum ", "expected a string or an object"),
    ] {
        if let Some(i) = out.find(rust) {
            let name_end = out[i + rust.len()..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .map_or(out.len(), |n| i + rust.len() + n);
            out.replace_range(i..name_end, json);
        }
    }
    out = out
        .replace("expected variant identifier", "expected a string")
        .replace("expected field identifier", "expected a string");
    if let Some((head, ty)) = out.rsplit_once(", expected ") {
        if let Some(range) = integer_range(ty) {
            out = format!("{head}, expected {range}");
        } else if ty == "f32" || ty == "f64" {
            out = format!("{head}, expected a number");
        }
    }
    out
}

/// What a Rust integer type holds, in words.
fn integer_range(ty: &str) -> Option<&'static str> {
    Some(match ty {
        "u8" => "an integer from 0 to 255",
        "u16" => "an integer from 0 to 65535",
        "u32" => "an integer from 0 to 4294967295",
        "u64" | "usize" => "an integer from 0 to 18446744073709551615",
        "i8" => "an integer from -128 to 127",
        "i16" => "an integer from -32768 to 32767",
        "i32" => "an integer from -2147483648 to 2147483647",
        "i64" | "isize" => "an integer from -9223372036854775808 to 9223372036854775807",
        _ => return None,
    })
}

fn unknown_field_name(msg: &str) -> Option<String> {
    let rest = msg.strip_prefix("unknown field `")?;
    Some(rest.split('`').next()?.to_string())
}

#[cfg(test)]
mod tests {
    use super::parse_json;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Options {
        flag: bool,
    }

    #[derive(Debug, Deserialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    #[allow(dead_code)]
    enum Message {
        Ping,
        Push { data: String },
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Request {
        count: Option<u32>,
        seed: Option<i64>,
        scale: Option<f32>,
        names: Option<Vec<String>>,
        options: Option<Options>,
        message: Option<Message>,
    }

    /// The error's message for `body`, which must fail to parse.
    fn message(body: &str) -> String {
        parse_json::<Request>(body.as_bytes())
            .expect_err(body)
            .message
    }

    #[test]
    fn type_errors_are_told_in_json_terms() {
        let cases = [
            (r#"{"count": -1}"#, "invalid `count`: invalid value: integer `-1`, expected an integer from 0 to 4294967295"),
            (r#"{"count": 4294967296}"#, "invalid `count`: invalid value: integer `4294967296`, expected an integer from 0 to 4294967295"),
            (r#"{"count": 1.5}"#, "invalid `count`: invalid type: number `1.5`, expected an integer from 0 to 4294967295"),
            (r#"{"seed": "x"}"#, "invalid `seed`: invalid type: string \"x\", expected an integer from -9223372036854775808 to 9223372036854775807"),
            (r#"{"scale": []}"#, "invalid `scale`: invalid type: array, expected a number"),
            (r#"{"names": {}}"#, "invalid `names`: invalid type: object, expected an array"),
            (r#"{"options": 3}"#, "invalid `options`: invalid type: integer `3`, expected an object"),
            (r#"{"options": []}"#, "invalid `options`: invalid type: array, expected an object"),
            (r#"{"message": 1}"#, "invalid `message`: invalid type: integer `1`, expected an object"),
            (r#"{"message": {"type": 5}}"#, "invalid `message.type`: invalid type: integer `5`, expected a string"),
        ];
        for (body, want) in cases {
            assert_eq!(message(body), want, "{body}");
        }
    }
}
