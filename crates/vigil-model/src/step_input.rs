//! The flat batch the model runs in one step: prefill chunks and decode tokens of several
//! sequences side by side, with where each new token's K/V goes and which rows to sample.

/// One sequence's share of a step: its last `query_len` tokens of `context_len` are computed now.
#[derive(Debug, Clone, Default)]
pub struct SeqInput {
    pub query_len: usize,
    pub context_len: usize,
    /// Physical KV blocks holding this sequence's tokens, in order.
    pub block_table: Vec<u32>,
}

#[derive(Debug, Clone, Default)]
pub struct StepInput {
    /// Query tokens of all sequences, sequence after sequence.
    pub token_ids: Vec<u32>,
    pub positions: Vec<u32>,
    pub seqs: Vec<SeqInput>,
    /// Per token, the KV row (`block_id * block_size + offset`) its K/V is written to.
    pub slot_mapping: Vec<u32>,
    /// Flat token rows whose logits are wanted, in output order.
    pub sample_rows: Vec<usize>,
}

impl StepInput {
    /// Empty, keeping the buffers for the next step.
    pub fn clear(&mut self) {
        self.token_ids.clear();
        self.positions.clear();
        self.slot_mapping.clear();
        self.sample_rows.clear();
        self.seqs.clear();
    }

    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    /// Checks the shapes agree; a violation is a bug in the caller, reported instead of UB.
    pub fn validate(&self, block_size: usize, num_blocks: usize) -> Result<(), String> {
        let t = self.token_ids.len();
        if self.positions.len() != t || self.slot_mapping.len() != t {
            return Err(format!(
                "positions/slot_mapping lengths differ from {t} tokens"
            ));
        }
        if self.seqs.iter().map(|s| s.query_len).sum::<usize>() != t {
            return Err("query lengths do not add up to the token count".into());
        }
        for s in &self.seqs {
            if s.query_len > s.context_len || s.context_len > s.block_table.len() * block_size {
                return Err(format!(
                    "sequence of {} tokens has {} blocks",
                    s.context_len,
                    s.block_table.len()
                ));
            }
            if s.block_table.iter().any(|&b| b as usize >= num_blocks) {
                return Err("block id out of range".into());
            }
        }
        if self
            .slot_mapping
            .iter()
            .any(|&s| s as usize >= num_blocks * block_size)
        {
            return Err("slot out of range".into());
        }
        if self.sample_rows.iter().any(|&r| r >= t) {
            return Err("sample row out of range".into());
        }
        Ok(())
    }
}
