//! Turns a `StepPlan` into the model's flat `StepInput` (reserving KV slots, applying
//! copy-on-write copies), runs the forward pass, and hands back one logits row per sequence
//! that samples this step. Before a sequence's tokens go in, its table slides past the blocks
//! its queries no longer read in sliding-window layers (`BlockTable::slide`); the engine then
//! gives back the local-layer KV that released (`ModelRunner::release_local_kv`).

use crate::block_pool::BlockId;
use crate::block_table::OutOfBlocks;
use crate::scheduler::StepPlan;
use crate::sequence::{SeqId, Sequence};
use std::collections::HashMap;
use vigil_model::kv_cache::KvCache;
use vigil_model::model::Model;
use vigil_model::step_input::{SeqInput, StepInput};

pub struct ModelRunner {
    pub model: Model,
    pub kv: KvCache,
    input: StepInput,
    /// The sliding-window layers, whose KV of released blocks is given back.
    local_layers: Vec<usize>,
}

/// What a logits row is for: the sequence's next token, checking draft token `i` (the pick
/// there is the next token too, while the draft holds), or scoring one of its prompt rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowUse {
    Next,
    Draft(usize),
    ScorePrompt,
}

/// The sequences that sample this step, in the order of their logits rows.
pub struct StepLogits<'a> {
    pub seq_ids: Vec<(SeqId, RowUse)>,
    pub logits: &'a [f32],
    pub vocab_size: usize,
}

impl ModelRunner {
    pub fn new(model: Model, kv: KvCache) -> Self {
        let c = &model.config;
        let local_layers = c.window_layers();
        // Their pages are given back block by block as the window slides past.
        kv.keep_small_pages(&local_layers);
        ModelRunner {
            model,
            kv,
            input: StepInput::default(),
            local_layers,
        }
    }

    /// The window of the model's sliding-window layers, if it has any.
    pub fn local_window(&self) -> Option<usize> {
        let c = &self.model.config;
        (self.local_layers.iter())
            .filter_map(|&l| c.layer_window(l))
            .min()
    }

    /// Give back the local-layer KV of `blocks` (those `released` still says are released:
    /// one may have been allocated again since it was queued).
    pub fn release_local_kv(&mut self, blocks: &[BlockId], released: impl Fn(BlockId) -> bool) {
        if !blocks.is_empty() {
            self.kv.release_blocks(&self.local_layers, blocks, released);
        }
    }

    /// Build the step input for `plan`, advancing each sequence's `num_computed_tokens`.
    pub fn prepare(
        &mut self,
        plan: &StepPlan,
        seqs: &mut HashMap<SeqId, Sequence>,
    ) -> Result<Vec<(SeqId, RowUse)>, OutOfBlocks> {
        let inp = &mut self.input;
        inp.clear();
        let mut sampling = Vec::new();
        for s in &plan.seqs {
            let Some(seq) = seqs.get_mut(&s.seq_id) else {
                continue;
            };
            let num_tokens = seq.num_tokens();
            let Some(table) = seq.table.as_mut() else {
                continue;
            };
            let start = seq.num_computed_tokens;
            let end = start + s.num_tokens;
            // No query of this sequence comes before `start` again (a rejected draft rolls
            // back to the step's own tokens); what continuing its prompt reads is kept too.
            table.slide(start, seq.num_prompt_tokens);
            // A budget that cut the draft short: verify the part that fits.
            seq.draft.truncate(end.saturating_sub(num_tokens));
            // The table may already hold slots for these tokens (prefix hits cover whole blocks
            // it holds); reserve only past its end.
            let have = table.num_tokens();
            if end > have {
                let appended = table.append_slots(end - have)?;
                if let Some(c) = appended.copy {
                    self.kv.copy_block(c.src_block, c.dst_block, c.num_tokens);
                }
            }
            for pos in start..end {
                let token = match seq.token_ids.get(pos) {
                    Some(&t) => t,
                    None => seq.draft[pos - num_tokens],
                };
                inp.token_ids.push(token);
                inp.positions.push(pos as u32);
                inp.slot_mapping.push(table.slot(pos).unwrap_or(0) as u32);
            }
            if let Some(from) = seq.params.score_prompt_from {
                // Scored rows run on from `from` without a gap: the next one, if this chunk
                // computes it, up to the row before the last prompt token. A row the prefix
                // cache served (before `start`) ends the scoring.
                let next = from + seq.prompt_scores.len();
                let first = inp.token_ids.len() - s.num_tokens;
                if next >= start {
                    for pos in next..end.min(seq.num_prompt_tokens.saturating_sub(1)) {
                        inp.sample_rows.push(first + pos - start);
                        sampling.push((seq.id, RowUse::ScorePrompt));
                    }
                }
            }
            inp.seqs.push(SeqInput {
                query_len: s.num_tokens,
                context_len: end,
                block_table: table.block_ids().to_vec(),
            });
            seq.num_computed_tokens = end;
            let drafted = seq.draft.len();
            if end == num_tokens + drafted {
                let last = inp.token_ids.len() - 1;
                for i in 0..drafted {
                    inp.sample_rows.push(last - drafted + i);
                    sampling.push((seq.id, RowUse::Draft(i)));
                }
                inp.sample_rows.push(last);
                sampling.push((seq.id, RowUse::Next));
            }
            // Blocks whose tokens all have KV now become reusable prefixes (draft rows are not
            // the sequence's until the engine confirms them).
            table.commit_full_blocks(&seq.token_ids[..end.min(num_tokens)]);
        }
        Ok(sampling)
    }

    pub fn run(&mut self, sampling: Vec<(SeqId, RowUse)>) -> StepLogits<'_> {
        debug_assert!(self
            .input
            .validate(self.kv.block_size, self.kv.num_blocks)
            .is_ok());
        let vocab_size = self.model.config.vocab_size;
        let logits = self.model.forward(&self.input, &mut self.kv);
        StepLogits {
            seq_ids: sampling,
            logits,
            vocab_size,
        }
    }
}
