//! A draft model: a smaller model of the same vocabulary proposes each draft greedily (its
//! argmax, a point mass, so the engine's verification stays exact). It keeps its own KV pool
//! and one block table per sequence, holding KV for a prefix of that sequence's tokens; each
//! call first brings that prefix level with the sequence (a rejected draft leaves the draft's
//! KV ahead of the sequence: it is cut back to the tokens they share, and only what the draft
//! model has not seen is computed), then decodes the drafts of every sequence together, one
//! token per forward.

use crate::block_table::{BlockTable, SharedBlockPool};
use crate::sequence::SeqId;
use std::collections::HashMap;
use vigil_model::kv_cache::KvCache;
use vigil_model::model::Model;
use vigil_model::step_input::{SeqInput, StepInput};

pub struct DraftModel {
    model: Model,
    kv: KvCache,
    pool: SharedBlockPool,
    seqs: HashMap<SeqId, DraftSeq>,
    input: StepInput,
}

/// A sequence's state in the draft model: its table, and the tokens whose KV it holds.
struct DraftSeq {
    table: BlockTable,
    tokens: Vec<u32>,
}

/// One sequence's draft to make: its tokens so far and how many to propose.
pub struct DraftRequest<'a> {
    pub seq_id: SeqId,
    pub context: &'a [u32],
    pub len: usize,
}

impl DraftModel {
    /// `model` drafts into `kv`, whose blocks its own pool hands out.
    pub fn new(model: Model, kv: KvCache) -> Self {
        DraftModel {
            pool: SharedBlockPool::new(kv.num_blocks, kv.block_size),
            model,
            kv,
            seqs: HashMap::new(),
            input: StepInput::default(),
        }
    }

    /// Blocks of the draft pool held by sequences (a leak check for tests).
    pub fn num_used_blocks(&self) -> usize {
        self.pool.borrow().num_used_blocks()
    }

    /// Forget sequences that are no longer running (their blocks go back to the draft pool).
    pub fn retain(&mut self, mut running: impl FnMut(SeqId) -> bool) {
        self.seqs.retain(|&id, _| running(id));
    }

    /// The drafts for `requests`, in their order (empty where the draft pool ran out).
    pub fn propose(&mut self, requests: &[DraftRequest<'_>]) -> Vec<Vec<u32>> {
        let mut drafts: Vec<Vec<u32>> = vec![Vec::new(); requests.len()];
        // Round 0 computes what each sequence's draft KV lacks (at least its last token, for
        // the logits of the first draft token); round i > 0 feeds draft token i - 1.
        let rounds = requests.iter().map(|r| r.len).max().unwrap_or(0);
        for round in 0..rounds {
            let inp = &mut self.input;
            inp.clear();
            let mut rows = Vec::new();
            for (i, r) in requests.iter().enumerate() {
                if round >= r.len || (round > 0 && drafts[i].len() < round) {
                    continue;
                }
                let seq = self.seqs.entry(r.seq_id).or_insert_with(|| DraftSeq {
                    table: self.pool.new_table(0),
                    tokens: Vec::new(),
                });
                if round == 0 {
                    let shared = (seq.tokens.iter())
                        .zip(r.context)
                        .take_while(|(a, b)| a == b)
                        .count();
                    let keep = shared.min(r.context.len().saturating_sub(1));
                    seq.table.truncate(keep);
                    seq.tokens.truncate(keep);
                    seq.tokens.extend_from_slice(&r.context[keep..]);
                } else {
                    seq.tokens.push(drafts[i][round - 1]);
                }
                let start = seq.table.num_tokens();
                let end = seq.tokens.len();
                let Ok(appended) = seq.table.append_slots(end - start) else {
                    // The draft pool is full: this sequence drafts nothing now and starts over.
                    self.seqs.remove(&r.seq_id);
                    drafts[i].clear();
                    continue;
                };
                if let Some(c) = appended.copy {
                    self.kv.copy_block(c.src_block, c.dst_block, c.num_tokens);
                }
                for (pos, slot) in (start..end).zip(appended.slots) {
                    inp.token_ids.push(seq.tokens[pos]);
                    inp.positions.push(pos as u32);
                    inp.slot_mapping.push(slot as u32);
                }
                inp.seqs.push(SeqInput {
                    query_len: end - start,
                    context_len: end,
                    block_table: seq.table.block_ids().to_vec(),
                });
                inp.sample_rows.push(inp.token_ids.len() - 1);
                rows.push(i);
            }
            if rows.is_empty() {
                break;
            }
            let vocab = self.model.config.vocab_size;
            let logits = self.model.forward(&self.input, &mut self.kv);
            for (k, &i) in rows.iter().enumerate() {
                drafts[i].push(argmax(&logits[k * vocab..(k + 1) * vocab]));
            }
        }
        drafts
    }
}

/// The lowest id holding the row's maximum (the sampler's greedy rule).
fn argmax(row: &[f32]) -> u32 {
    let mut best = (f32::NEG_INFINITY, 0u32);
    for (i, &l) in row.iter().enumerate() {
        if l > best.0 {
            best = (l, i as u32);
        }
    }
    best.1
}
