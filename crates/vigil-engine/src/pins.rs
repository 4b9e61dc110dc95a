//! KV pins: block tables the engine keeps between requests, on behalf of a session.
//!
//! A pin is a session's durable KV: its tokens and a table holding their blocks. A request on
//! the session starts from a [fork](BlockTable::fork) of the pin cut to the longest common
//! prefix with its prompt, so only the new tokens are computed, and a request that `saves`
//! replaces the pin with its own table when it ends. The pin keeps its own tokens, so a fork
//! is correct whatever the caller believes the session holds: a stale belief costs recompute,
//! never wrong KV.
//!
//! Under memory pressure the engine drops the table of the least recently used idle pin (one
//! no live request was forked from or saves to). The pin keeps its tokens; its full blocks stay
//! in the prefix cache until reused, and what is gone is recomputed on next use. Only when
//! nothing at all can run does a busy pin go too; the requests forked from it keep every block
//! they share with it, so a busy session's KV in use is never freed.

use crate::block_table::BlockTable;
use std::collections::{HashMap, HashSet};

/// Names a pin; the caller (a session) chooses it.
pub type PinKey = u64;

/// What a saving request leaves in its pin when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinSave {
    /// The prompt only (ingest, warm): generated tokens are dropped.
    Prompt,
    /// Prompt and generated tokens (an agent turn keeps its reply as history).
    All,
}

/// How a request uses a pin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinUse {
    pub key: PinKey,
    /// Replace the pin with this request's KV when it ends.
    pub save: Option<PinSave>,
    /// Also save when the request is aborted (what was computed is kept).
    pub save_on_abort: bool,
}

/// A pin's KV copied out of the cache: its tokens and their rows (`KvCache::read_rows`), to
/// be written to disk and read back into an engine of the same model.
#[derive(Debug, Clone, PartialEq)]
pub struct PinKv {
    pub tokens: Vec<u32>,
    pub rows: Vec<u8>,
    pub dtype: vigil_model::kv_cache::KvDtype,
    pub num_layers: usize,
    pub kv_dim: usize,
    /// Rows of tokens before this one lack their sliding-window layers' KV (it was released;
    /// they read as zeros there): a restore reuses no more than a query can continue from.
    pub local_from: usize,
}

impl PinKv {
    /// Bytes of one token's rows (every layer, K and V).
    pub fn row_bytes(&self) -> usize {
        self.num_layers * 2 * self.kv_dim * self.dtype.size()
    }

    /// Keep the first `n` tokens and their rows.
    pub fn truncate(&mut self, n: usize) {
        let total = self.tokens.len();
        if n >= total {
            return;
        }
        let row = self.kv_dim * self.dtype.size();
        let mut rows = Vec::with_capacity(self.num_layers * 2 * n * row);
        for part in self.rows.chunks_exact(total * row) {
            rows.extend_from_slice(&part[..n * row]);
        }
        self.rows = rows;
        self.tokens.truncate(n);
    }
}

pub struct KvPin {
    pub tokens: Vec<u32>,
    /// `None` once dropped under memory pressure.
    pub table: Option<BlockTable>,
    /// The content this one replaced, kept until the next save: a request rendered from the
    /// session's state just before the save (the caller learns of it a moment later) still
    /// finds its prefix, even when the new content diverges early (a sliding window).
    previous: Option<(Vec<u32>, BlockTable)>,
    last_used: u64,
}

impl KvPin {
    /// Tokens whose KV the pin holds.
    pub fn num_kv_tokens(&self) -> usize {
        self.table.as_ref().map_or(0, BlockTable::num_tokens)
    }
}

#[derive(Default)]
pub struct PinStore {
    pins: HashMap<PinKey, KvPin>,
    clock: u64,
    /// Pin tables dropped under memory pressure.
    pub num_evictions: u64,
    /// Bumped by every change of what the pins hold, so readers republish only on change.
    pub generation: u64,
}

fn common_prefix_len(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PinStore {
    pub fn get(&self, key: PinKey) -> Option<&KvPin> {
        self.pins.get(&key)
    }

    pub fn len(&self) -> usize {
        self.pins.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pins.is_empty()
    }

    /// A fork of the pin covering the longest common prefix of its tokens and `prompt`, never
    /// the whole prompt (the last prompt token must be computed to get logits). `None` when
    /// there is no pin, no table or nothing in common.
    pub fn fork_for(&mut self, key: PinKey, prompt: &[u32]) -> Option<BlockTable> {
        self.clock += 1;
        let pin = self.pins.get_mut(&key)?;
        pin.last_used = self.clock;
        let current = pin.table.as_ref().map(|t| (&pin.tokens, t));
        let previous = pin.previous.as_ref().map(|(tokens, t)| (tokens, t));
        fn usable<'a>(
            tokens: &[u32],
            table: &'a BlockTable,
            prompt: &[u32],
        ) -> (usize, &'a BlockTable) {
            let len = common_prefix_len(tokens, prompt)
                .min(table.num_tokens())
                .min(prompt.len().saturating_sub(1));
            // Never back into sliding-window KV that was released.
            (table.usable_len(len), table)
        }
        let (len, table) = [current, previous]
            .into_iter()
            .flatten()
            .map(|(tokens, table)| usable(tokens, table, prompt))
            .max_by_key(|&(len, _)| len)?;
        if len == 0 {
            return None;
        }
        let mut fork = table.fork();
        fork.truncate(len);
        Some(fork)
    }

    /// Make `table` (holding KV for a prefix of `tokens`) the pin's content.
    pub fn save(&mut self, key: PinKey, tokens: Vec<u32>, mut table: BlockTable) {
        self.clock += 1;
        self.generation += 1;
        table.truncate(tokens.len());
        let previous = (self.pins.remove(&key)).and_then(|old| old.table.map(|t| (old.tokens, t)));
        self.pins.insert(
            key,
            KvPin {
                tokens,
                table: Some(table),
                previous,
                last_used: self.clock,
            },
        );
    }

    /// Drop a pin and release its blocks.
    pub fn remove(&mut self, key: PinKey) -> bool {
        self.generation += 1;
        self.pins.remove(&key).is_some()
    }

    /// Drop the table of the least recently used pin not in `busy`; false when there is none.
    pub fn evict_idle(&mut self, busy: &HashSet<PinKey>) -> bool {
        let victim = (self.pins.iter())
            .filter(|(k, p)| (p.table.is_some() || p.previous.is_some()) && !busy.contains(k))
            .min_by_key(|(_, p)| p.last_used)
            .map(|(&k, _)| k);
        let Some(key) = victim else {
            return false;
        };
        if let Some(pin) = self.pins.get_mut(&key) {
            pin.table = None;
            pin.previous = None;
            self.num_evictions += 1;
            self.generation += 1;
        }
        true
    }

    pub fn tables(&self) -> impl Iterator<Item = &BlockTable> {
        (self.pins.values()).flat_map(|p| p.table.iter().chain(p.previous.iter().map(|(_, t)| t)))
    }

    /// Each pin's key and resident KV tokens.
    pub fn kv_tokens(&self) -> impl Iterator<Item = (PinKey, usize)> + '_ {
        self.pins.iter().map(|(&k, p)| (k, p.num_kv_tokens()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_table::SharedBlockPool;

    fn table_with(pool: &SharedBlockPool, n: usize) -> BlockTable {
        let mut t = pool.new_table(0);
        let _ = t.append_slots(n);
        t
    }

    #[test]
    fn fork_covers_the_common_prefix_but_never_the_last_prompt_token() {
        let pool = SharedBlockPool::new(16, 4);
        let mut pins = PinStore::default();
        pins.save(1, vec![1, 2, 3, 4, 5, 6], table_with(&pool, 6));
        let f = pins.fork_for(1, &[1, 2, 3, 9, 9]).map(|t| t.num_tokens());
        assert_eq!(f, Some(3));
        let f = pins
            .fork_for(1, &[1, 2, 3, 4, 5, 6])
            .map(|t| t.num_tokens());
        assert_eq!(f, Some(5));
        let f = pins
            .fork_for(1, &[1, 2, 3, 4, 5, 6, 7, 8])
            .map(|t| t.num_tokens());
        assert_eq!(f, Some(6));
        assert!(pins.fork_for(1, &[7, 7]).is_none());
        assert!(pins.fork_for(2, &[1, 2]).is_none());
        let tables: Vec<&BlockTable> = pins.tables().collect();
        pool.check_invariants(&tables).unwrap();
    }

    #[test]
    fn a_request_rendered_before_a_save_still_finds_its_prefix() {
        let pool = SharedBlockPool::new(32, 4);
        let mut pins = PinStore::default();
        pins.save(1, vec![1, 2, 3, 4, 5, 6, 7, 8], table_with(&pool, 8));
        // The window slid: the new content diverges right after the opening (tokens 1, 2).
        pins.save(1, vec![1, 2, 9, 9, 9, 9], table_with(&pool, 6));
        let f = pins
            .fork_for(1, &[1, 2, 3, 4, 5, 6, 7, 8, 0])
            .map(|t| t.num_tokens());
        assert_eq!(
            f,
            Some(8),
            "the previous content serves the older rendering"
        );
        let f = pins
            .fork_for(1, &[1, 2, 9, 9, 9, 9, 0])
            .map(|t| t.num_tokens());
        assert_eq!(f, Some(6));
        pins.save(1, vec![1, 2, 9, 9, 9, 9, 5], table_with(&pool, 7));
        let f = pins
            .fork_for(1, &[1, 2, 3, 4, 5, 6, 7, 8, 0])
            .map(|t| t.num_tokens());
        assert_eq!(f, Some(2), "only one generation is kept");
        let tables: Vec<&BlockTable> = pins.tables().collect();
        pool.check_invariants(&tables).unwrap();
        assert!(pins.remove(1));
        assert_eq!(pool.borrow().num_free_blocks(), 32);
    }

    #[test]
    fn eviction_skips_busy_pins_and_remove_frees_every_block() {
        let pool = SharedBlockPool::new(16, 4);
        let mut pins = PinStore::default();
        pins.save(1, vec![0; 8], table_with(&pool, 8));
        pins.save(2, vec![1; 8], table_with(&pool, 8));
        assert_eq!(pool.borrow().num_free_blocks(), 12);
        let busy: HashSet<PinKey> = [1].into_iter().collect();
        assert!(pins.evict_idle(&busy));
        assert_eq!(pins.get(2).map(KvPin::num_kv_tokens), Some(0));
        assert_eq!(pins.get(1).map(KvPin::num_kv_tokens), Some(8));
        assert!(!pins.evict_idle(&busy));
        assert!(pins.remove(1));
        assert_eq!(pool.borrow().num_free_blocks(), 16);
    }
}
