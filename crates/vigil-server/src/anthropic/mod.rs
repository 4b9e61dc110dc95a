//! Anthropic-compatible routes.

pub mod convert;
pub mod messages;
pub mod types;
