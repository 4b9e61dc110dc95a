//! OpenAI-compatible routes.

pub mod chat;
pub mod completions;
pub mod messages;
pub mod params;
pub mod tokenize;
pub mod types;
