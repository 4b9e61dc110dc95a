//! Request bodies parsed strictly: invalid JSON, wrong types and unknown fields become a 400
//! naming the field (its JSON path), and a body over the limit a 413, in the route's envelope.

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
        let msg = strip_position(&inner.to_string());
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

/// serde_json appends " at line L column C", which means nothing to an HTTP client.
fn strip_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg.to_string(),
    }
}

fn unknown_field_name(msg: &str) -> Option<String> {
    let rest = msg.strip_prefix("unknown field `")?;
    Some(rest.split('`').next()?.to_string())
}
