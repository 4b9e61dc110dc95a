//! Sliding-window KV release: which blocks' local-layer KV no table needs any more.
//!
//! A local (sliding-window) layer's query at position `t` reads keys `t + 1 - window ..= t`
//! only, so once a table's next query is far enough on, its leading blocks are of no more use
//! to those layers. Global layers keep every block, so the blocks stay in the pool; only
//! their local-layer rows go (the runner gives their pages back, `KvCache::release_blocks`).
//!
//! A block sits at the same index in every table that holds it (forks share prefixes, prefix
//! hits match from position 0), so each table keeps a *horizon*: the count of its leading
//! blocks it no longer needs for local layers (less a *kept* range, the blocks a query at its
//! prompt's end reads: see `BlockTable::slide`). The pool counts, per block, the tables
//! holding it for its local KV (its *local holders*). A table's horizon moving on past a block
//! (a slide) that leaves it with none *releases* the block's local KV: marked here and queued
//! for the runner. A table dropping a block (drop, truncate, copy-on-write) leaves it
//! unreleased even with no local holder: a finished sequence's tail still serves prefix hits.
//! Released KV is back only when the block is allocated afresh and written again.
//!
//! Whoever reuses KV from a block (a prefix hit, a fork of a pin, a restore) must keep the
//! next query's window clear of released blocks: [`LocalKv::usable_len`] says how much of a
//! table may be reused.

use crate::block_pool::BlockId;

pub(crate) struct LocalKv {
    /// The local layers' window; `None`: no local layers, nothing is ever released.
    window: Option<usize>,
    block_size: usize,
    /// Per block: the tables holding it at or past their horizon.
    holders: Vec<u32>,
    /// Per block: its local-layer KV was released since it was last allocated.
    released: Vec<bool>,
    /// Blocks released since the last `take_released`, for the runner to give back.
    queue: Vec<BlockId>,
}

impl LocalKv {
    pub(crate) fn new(num_blocks: usize, block_size: usize) -> Self {
        LocalKv {
            window: None,
            block_size,
            holders: vec![0; num_blocks],
            released: vec![false; num_blocks],
            queue: Vec::new(),
        }
    }

    pub(crate) fn window(&self) -> Option<usize> {
        self.window
    }

    /// Set the window; only while no block has been released.
    pub(crate) fn set_window(&mut self, window: Option<usize>) {
        debug_assert!(!self.released.iter().any(|&r| r));
        self.window = window.filter(|&w| w > 0);
    }

    /// The first block a query at position `q` or later may read in a local layer (0 without
    /// a window): the one holding key `q + 1 - window`.
    pub(crate) fn first_needed_block(&self, q: usize) -> usize {
        self.window
            .map_or(0, |w| (q + 1).saturating_sub(w) / self.block_size)
    }

    /// A freshly allocated block: its allocating table is its one local holder.
    pub(crate) fn on_allocate(&mut self, id: BlockId) {
        self.holders[id as usize] = 1;
        self.released[id as usize] = false;
    }

    pub(crate) fn hold(&mut self, id: BlockId) {
        self.holders[id as usize] += 1;
    }

    /// A table stops holding `id` (drop, truncate, copy-on-write): never releases.
    pub(crate) fn unhold(&mut self, id: BlockId) {
        let h = &mut self.holders[id as usize];
        debug_assert!(*h > 0, "block {id} has no local holder to drop");
        *h = h.saturating_sub(1);
    }

    /// A table's horizon moved past `id`: released when no other table needs it.
    pub(crate) fn slide_past(&mut self, id: BlockId) {
        self.unhold(id);
        let i = id as usize;
        if self.holders[i] == 0 && self.window.is_some() && !self.released[i] {
            self.released[i] = true;
            self.queue.push(id);
        }
    }

    pub(crate) fn is_released(&self, id: BlockId) -> bool {
        self.released[id as usize]
    }

    pub(crate) fn holders(&self, id: BlockId) -> u32 {
        self.holders[id as usize]
    }

    pub(crate) fn take_released(&mut self) -> Vec<BlockId> {
        std::mem::take(&mut self.queue)
    }

    /// The most tokens, up to `n`, of a table holding `blocks` that a query may continue
    /// from: the window before it holds no released block. Block-aligned when `n` is.
    pub(crate) fn usable_len(&self, blocks: &[BlockId], n: usize) -> usize {
        let mut n = n.min(blocks.len() * self.block_size);
        loop {
            let held = n.div_ceil(self.block_size);
            let Some(r) = (0..held).rev().find(|&i| self.is_released(blocks[i])) else {
                return n;
            };
            if self.first_needed_block(n) > r {
                return n;
            }
            // Any length past block `r`'s start still reads block `r`.
            n = r * self.block_size;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(window: usize, bs: usize, n: usize) -> LocalKv {
        let mut l = LocalKv::new(n, bs);
        l.set_window(Some(window));
        l
    }

    #[test]
    fn the_first_needed_block_follows_the_attention_window() {
        let l = local(8, 4, 8);
        // A query at 8 reads keys 1..=8: block 0 still.
        assert_eq!(l.first_needed_block(8), 0);
        // At 11: keys 4..=11, block 0 slid past.
        assert_eq!(l.first_needed_block(11), 1);
        assert_eq!(l.first_needed_block(12), 1);
        let none = LocalKv::new(8, 4);
        assert_eq!(none.first_needed_block(1000), 0);
    }

    #[test]
    fn release_waits_for_the_last_holder_and_drops_never_release() {
        let mut l = local(8, 4, 4);
        l.on_allocate(0);
        l.hold(0);
        l.slide_past(0);
        assert!(!l.is_released(0));
        l.slide_past(0);
        assert!(l.is_released(0));
        assert_eq!(l.take_released(), vec![0]);
        l.on_allocate(1);
        l.unhold(1);
        assert!(!l.is_released(1));
        assert!(l.take_released().is_empty());
        l.on_allocate(0);
        assert!(!l.is_released(0));
    }

    #[test]
    fn usable_len_keeps_the_window_clear_of_released_blocks() {
        let mut l = local(8, 4, 8);
        let blocks: Vec<BlockId> = (0..8).collect();
        for &b in &blocks {
            l.on_allocate(b);
        }
        assert_eq!(l.usable_len(&blocks, 30), 30);
        l.slide_past(2);
        // 30 reads from key 23 (block 5): fine. 18 reads from 11 (block 2): back to 8, whose
        // window (1..=8) is blocks 0 and 1.
        assert_eq!(l.usable_len(&blocks, 30), 30);
        assert_eq!(l.usable_len(&blocks, 18), 8);
        assert_eq!(l.usable_len(&blocks, 19), 19);
        l.slide_past(0);
        assert_eq!(l.usable_len(&blocks, 18), 0);
    }
}
