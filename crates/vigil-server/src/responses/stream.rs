//! Reads one generation into Responses output items, emitting the stream's events as it goes
//! (when streaming): `response.created`, `response.in_progress`, then per item
//! `output_item.added` → its deltas → `output_item.done`, and `response.completed` (or
//! `response.incomplete` when cut). The same reader builds the whole response when not
//! streaming, so both carry the same items.

use super::output::{self, Produced};
use crate::error::ApiError;
use crate::generate::{GenEvent, TokenInfo, Usage};
use crate::openai::chat::{logprobs_json, Plan};
use crate::output::{OutDelta, OutputParser};
use serde_json::{json, Value};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

/// The item being written.
enum Open {
    None,
    Reasoning {
        index: usize,
        id: String,
        text: String,
    },
    Message {
        index: usize,
        id: String,
        text: String,
        logprobs: Vec<Value>,
    },
}

/// Emits numbered events (none when not streaming) and collects the finished items.
pub(crate) struct Reader<'a> {
    tx: Option<UnboundedSender<String>>,
    seq: u64,
    plan: &'a Plan,
    output: Vec<Value>,
    open: Open,
    produced: Produced,
    /// Tokens whose logprobs no text delta has carried yet.
    pending: Vec<TokenInfo>,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(plan: &'a Plan, tx: Option<UnboundedSender<String>>) -> Self {
        Reader {
            tx,
            seq: 0,
            plan,
            output: Vec::new(),
            open: Open::None,
            produced: Produced::default(),
            pending: Vec::new(),
        }
    }

    /// Send one event; false once the client is gone.
    pub(crate) fn emit(&mut self, kind: &str, mut payload: Value) -> bool {
        let Some(tx) = &self.tx else {
            return true;
        };
        payload["type"] = json!(kind);
        payload["sequence_number"] = json!(self.seq);
        self.seq += 1;
        tx.send(format!("{kind}\n{payload}")).is_ok()
    }

    fn logprobs(&mut self) -> Vec<Value> {
        if !self.plan.logprobs || self.pending.is_empty() {
            return Vec::new();
        }
        let lp = logprobs_json(&std::mem::take(&mut self.pending), self.plan.top_logprobs);
        lp["content"].as_array().cloned().unwrap_or_default()
    }

    fn close(&mut self) -> bool {
        let cut = self.produced.cut;
        match std::mem::replace(&mut self.open, Open::None) {
            Open::None => true,
            Open::Reasoning { index, id, text } => {
                let item = output::reasoning_item(&id, &text, true);
                self.emit(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
                );
                self.output.push(item.clone());
                self.emit(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                )
            }
            Open::Message {
                index,
                id,
                text,
                logprobs,
            } => {
                let part = output::text_part(&text, &logprobs);
                self.emit(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                        "text": text, "logprobs": logprobs}),
                );
                self.emit(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
                );
                let item = output::message_item(&id, Some(part), output::status(cut));
                self.output.push(item.clone());
                self.emit(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                )
            }
        }
    }

    fn open_message(&mut self) -> bool {
        let index = self.output.len();
        let id = crate::ids::new_id("msg");
        let item = output::message_item(&id, None, "in_progress");
        let ok = self.emit(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        ) && self.emit(
            "response.content_part.added",
            json!({"item_id": id, "output_index": index, "content_index": 0,
                "part": output::text_part("", &[])}),
        );
        self.open = Open::Message {
            index,
            id,
            text: String::new(),
            logprobs: Vec::new(),
        };
        ok
    }

    fn push(&mut self, deltas: Vec<OutDelta>) -> bool {
        for d in deltas {
            let ok = match d {
                OutDelta::Reasoning(s) => {
                    self.produced.reasoning.push_str(&s);
                    if !self.plan.include_reasoning {
                        continue;
                    }
                    if !matches!(self.open, Open::Reasoning { .. }) {
                        self.close();
                        let index = self.output.len();
                        let id = crate::ids::new_id("rs");
                        let item = output::reasoning_item(&id, "", false);
                        self.emit(
                            "response.output_item.added",
                            json!({"output_index": index, "item": item}),
                        );
                        self.open = Open::Reasoning {
                            index,
                            id,
                            text: String::new(),
                        };
                    }
                    let Open::Reasoning { index, id, text } = &mut self.open else {
                        continue;
                    };
                    text.push_str(&s);
                    let payload = json!({"item_id": id, "output_index": index,
                        "content_index": 0, "delta": s});
                    self.emit("response.reasoning_text.delta", payload)
                }
                OutDelta::Content(s) => {
                    self.produced.text.push_str(&s);
                    if !matches!(self.open, Open::Message { .. }) {
                        self.close();
                        self.open_message();
                    }
                    let lp = self.logprobs();
                    let Open::Message {
                        index,
                        id,
                        text,
                        logprobs,
                    } = &mut self.open
                    else {
                        continue;
                    };
                    text.push_str(&s);
                    logprobs.extend(lp.iter().cloned());
                    let payload = json!({"item_id": id, "output_index": index,
                        "content_index": 0, "delta": s, "logprobs": lp});
                    self.emit("response.output_text.delta", payload)
                }
            };
            if !ok {
                return false;
            }
        }
        true
    }

    /// Read the generation to its end. `Ok(None)`: the client went away mid-stream.
    pub(crate) async fn read(
        &mut self,
        state: &crate::state::SharedState,
        mut rx: UnboundedReceiver<GenEvent>,
        max_tool_calls: Option<u32>,
    ) -> Result<Option<(Vec<Value>, Produced, Usage)>, ApiError> {
        let plan = self.plan;
        let mut parser = OutputParser::new(plan.thinking, plan.tool_format, plan.forced.as_ref());
        while let Some(ev) = rx.recv().await {
            match ev {
                GenEvent::Delta { text, tokens } => {
                    self.pending.extend(tokens);
                    let deltas = parser.push(&text);
                    if !self.push(deltas) {
                        return Ok(None);
                    }
                }
                GenEvent::Failed(e) => return Err(e),
                GenEvent::Done { finish, usage, .. } => {
                    let (rest, mut calls) = parser.finish();
                    self.produced.cut = matches!(finish, crate::generate::Finish::Length { .. });
                    if !self.push(rest) {
                        return Ok(None);
                    }
                    if !plan.parallel_tool_calls {
                        calls.truncate(1);
                    }
                    if let Some(max) = max_tool_calls {
                        calls.truncate(max as usize);
                    }
                    crate::openai::chat::count_malformed(state, &calls);
                    // A message item even when empty, unless the output is calls only.
                    let no_message = !self.output.iter().any(|i| i["type"] == "message")
                        && !matches!(self.open, Open::Message { .. });
                    if no_message && calls.is_empty() {
                        self.close();
                        self.open_message();
                    }
                    // What no text delta carried goes on the text's final logprobs.
                    let lp = self.logprobs();
                    if let Open::Message { logprobs, .. } = &mut self.open {
                        logprobs.extend(lp);
                    }
                    if !self.close() {
                        return Ok(None);
                    }
                    let status = output::status(self.produced.cut);
                    for c in &calls {
                        let index = self.output.len();
                        let args = c.arguments_string();
                        let item = output::call_item(c, "", "in_progress");
                        let id = item["id"].clone();
                        self.emit(
                            "response.output_item.added",
                            json!({"output_index": index, "item": item}),
                        );
                        self.emit(
                            "response.function_call_arguments.delta",
                            json!({"item_id": id, "output_index": index, "delta": args}),
                        );
                        self.emit(
                            "response.function_call_arguments.done",
                            json!({"item_id": id, "output_index": index, "name": c.name, "arguments": args}),
                        );
                        let item = output::call_item(c, &args, status);
                        self.output.push(item.clone());
                        if !self.emit(
                            "response.output_item.done",
                            json!({"output_index": index, "item": item}),
                        ) {
                            return Ok(None);
                        }
                    }
                    self.produced.calls = calls;
                    let output = std::mem::take(&mut self.output);
                    return Ok(Some((output, std::mem::take(&mut self.produced), usage)));
                }
            }
        }
        Err(ApiError::internal("generation ended without a result"))
    }
}
