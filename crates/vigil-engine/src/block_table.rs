//! Owned handles on a sequence's KV blocks: append, fork, truncate, prefix-cache commit.
//!
//! A [`BlockTable`] is the only way to hold blocks of a [`SharedBlockPool`]; its `Drop` releases
//! every ref it holds, so a sequence, fork or session cannot leak KV by forgetting to free.
//! The pool is shared by `Rc<RefCell<_>>`: the engine thread owns all of it, nothing crosses
//! threads, and no borrow outlives one method call.
//!
//! Copy-on-write is deferred to the first write. [`BlockTable::fork`] never allocates: the child
//! shares every block, the partial last one included. A write may only land in a block that is
//! [writable](BlockPool::is_writable) (one holder, not promised to the prefix cache), so when
//! [`BlockTable::append_slots`] is about to write into a partial last block it either
//! - copies it to a fresh block when it is shared, returning the [`CopyOp`] the runner must
//!   apply to the KV tensors before the step writes, or
//! - drops its cache entry in place when this table is its only holder (a cached block made
//!   partial again by [`BlockTable::truncate`]); no copy is needed then.
//!
//! Deferring means forks that are dropped or truncated back to a block boundary cost nothing,
//! and a truncate into a shared block (a session rewinding to a point a fork shares) needs no
//! allocation, so `fork` and `truncate` cannot fail.
//!
//! With sliding-window layers a table also keeps a *horizon* (`local_kv`): the leading blocks
//! whose local-layer KV its next queries no longer read. [`BlockTable::slide`] moves it on as
//! the sequence advances, keeping the blocks a query at the prompt's end reads (the same
//! prompt again, a prompt-only pin); `truncate` moves it back, and a caller cutting a table
//! back must first cut to [`BlockTable::usable_len`] so that no released block is needed again.

use std::cell::{Ref, RefCell};
use std::rc::Rc;

use crate::block_pool::{BlockId, BlockPool, CachedBlock};

/// Physical KV row of one token: `block_id * block_size + offset`.
pub type Slot = usize;

/// The engine thread's handle on the block pool; cheap to clone.
#[derive(Clone)]
pub struct SharedBlockPool(Rc<RefCell<BlockPool>>);

/// Not enough free blocks for an append; the table is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("out of KV blocks: {needed} needed, {free} free")]
pub struct OutOfBlocks {
    pub needed: usize,
    pub free: usize,
}

/// Copy the KV rows of the first `num_tokens` slots of `src_block` into `dst_block`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyOp {
    pub src_block: BlockId,
    pub dst_block: BlockId,
    pub num_tokens: usize,
}

/// Where the appended tokens' K/V go, and the copy that must happen first.
#[must_use = "the slots say where to write, and a copy must be applied before writing"]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AppendedSlots {
    pub slots: Vec<Slot>,
    pub copy: Option<CopyOp>,
}

impl SharedBlockPool {
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Self::from_pool(BlockPool::new(num_blocks, block_size))
    }

    pub fn from_pool(pool: BlockPool) -> Self {
        Self(Rc::new(RefCell::new(pool)))
    }

    /// Read access for accounting queries (`num_free_blocks`, `usage`, `lookup_prefix`, ...).
    pub fn borrow(&self) -> Ref<'_, BlockPool> {
        self.0.borrow()
    }

    /// An empty table; `salt` separates prefix-cache namespaces (cache salt, adapter).
    pub fn new_table(&self, salt: u64) -> BlockTable {
        BlockTable {
            pool: self.clone(),
            block_size: self.borrow().block_size(),
            blocks: Vec::new(),
            num_tokens: 0,
            salt,
            cached: Vec::new(),
            cache_stopped: false,
            no_cache_from: usize::MAX,
            horizon: 0,
            kept: 0..0,
        }
    }

    /// Release local-layer KV of blocks every table has slid past (`BlockPool::set_local_window`).
    pub fn set_local_window(&self, window: Option<usize>) -> bool {
        self.0.borrow_mut().set_local_window(window)
    }

    /// The blocks whose local-layer KV was released since the last call
    /// (`BlockPool::take_local_released`).
    pub fn take_local_released(&self) -> Vec<BlockId> {
        self.0.borrow_mut().take_local_released()
    }

    /// A table holding the longest cached prefix of `prompt` (whole blocks, never the last
    /// token: see [`BlockPool::max_prefix_hit_tokens`]) that a query may continue from (no
    /// released block in the window before its end). Its `num_tokens()` is the number of
    /// prompt tokens whose KV is already there; the caller appends and computes the rest.
    pub fn table_with_prefix(&self, prompt: &[u32], salt: u64) -> BlockTable {
        let mut table = self.new_table(salt);
        let mut pool = self.0.borrow_mut();
        let bs = table.block_size;
        let max = pool.max_prefix_hit_tokens(prompt.len());
        let mut hits = pool.lookup_prefix_chain(&prompt[..max], salt);
        let ids: Vec<BlockId> = hits.iter().map(|h| h.id).collect();
        let usable = pool.local.usable_len(&ids, hits.len() * bs);
        hits.truncate(usable / bs);
        let n = hits.len() * bs;
        table.horizon = pool.local.first_needed_block(n).min(hits.len());
        for (i, hit) in hits.iter().enumerate() {
            pool.touch(hit.id);
            if i >= table.horizon {
                pool.local.hold(hit.id);
            }
        }
        table.blocks = hits.iter().map(|h| h.id).collect();
        table.num_tokens = n;
        table.cached = hits;
        table
    }

    /// [`BlockPool::check_invariants`], also checking that every table belongs to this pool.
    pub fn check_invariants(&self, tables: &[&BlockTable]) -> Result<(), String> {
        if let Some(i) = tables.iter().position(|t| !Rc::ptr_eq(&t.pool.0, &self.0)) {
            return Err(format!("table {i} belongs to another pool"));
        }
        self.borrow().check_invariants(tables)
    }
}

/// A sequence's blocks: `block_ids()[i]` holds tokens `i*block_size .. (i+1)*block_size`.
pub struct BlockTable {
    pool: SharedBlockPool,
    block_size: usize,
    blocks: Vec<BlockId>,
    num_tokens: usize,
    salt: u64,
    /// Cache identities of the leading full blocks already committed to the prefix cache.
    /// Usually `cached[i].id == blocks[i]`; it names another block when an identical one was
    /// cached first (the chain continues from the canonical copy).
    cached: Vec<CachedBlock>,
    /// Set when a hash collision blocks committing further; cleared by `truncate`.
    cache_stopped: bool,
    /// Blocks from this token on are never committed to the prefix cache: their KV is not
    /// what computing the tokens gives (a position-shifted window), and so is every block
    /// computed after them. Kept by forks and truncation.
    no_cache_from: usize,
    /// Leading blocks whose local-layer KV this table no longer needs (`local_kv`); it is one
    /// of the local holders of every block from here on.
    horizon: usize,
    /// Blocks before the horizon it still holds for their local-layer KV: those a query at
    /// the prompt's end reads (see `slide`). Empty or wholly before `horizon`.
    kept: std::ops::Range<usize>,
}

impl BlockTable {
    /// Tokens with a slot in this table (computed or about to be).
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    pub fn block_ids(&self) -> &[BlockId] {
        &self.blocks
    }

    pub fn salt(&self) -> u64 {
        self.salt
    }

    pub fn pool(&self) -> &SharedBlockPool {
        &self.pool
    }

    /// Leading full blocks already committed to the prefix cache.
    pub fn num_committed_blocks(&self) -> usize {
        self.cached.len()
    }

    pub(crate) fn cached_chain(&self) -> &[CachedBlock] {
        &self.cached
    }

    /// Leading blocks whose local-layer KV this table no longer needs.
    pub fn horizon(&self) -> usize {
        self.horizon
    }

    /// Whether the table holds block `i` for its local-layer KV.
    pub(crate) fn needs_local(&self, i: usize) -> bool {
        i >= self.horizon || self.kept.contains(&i)
    }

    /// The next query is at position `q` or later: blocks no such query reads in a local
    /// layer are slid past, and those no other table needs have their local KV released
    /// (`BlockPool::take_local_released` lists them), except the blocks a query at `prompt`
    /// (the prompt's end) reads: a request with the same prompt, or a prompt-only pin, starts
    /// there. That costs at most one window more per table. No-op without a local window.
    pub fn slide(&mut self, q: usize, prompt: usize) {
        let (to, keep_from) = {
            let local = &self.pool.borrow().local;
            (
                local.first_needed_block(q),
                local.first_needed_block(prompt),
            )
        };
        let keep_from = keep_from.max(self.horizon);
        let keep_to = prompt.div_ceil(self.block_size).min(self.blocks.len());
        if self.kept.is_empty() && to > keep_from && keep_from < keep_to {
            self.kept = keep_from..keep_to;
        }
        self.advance_horizon(to);
    }

    /// Slide past the first `h` blocks (see [`BlockTable::slide`]).
    pub(crate) fn advance_horizon(&mut self, h: usize) {
        let h = h.min(self.blocks.len());
        if h <= self.horizon {
            return;
        }
        let mut pool = self.pool.0.borrow_mut();
        for i in self.horizon..h {
            if !self.kept.contains(&i) {
                pool.local.slide_past(self.blocks[i]);
            }
        }
        self.horizon = h;
    }

    /// The most tokens, up to `n`, a query may continue from: none of the blocks its window
    /// reads had its local KV released. A caller cutting the table back cuts to this.
    pub fn usable_len(&self, n: usize) -> usize {
        let n = n.min(self.num_tokens);
        self.pool.borrow().local.usable_len(&self.blocks, n)
    }

    /// The KV row of token `pos`, if the table has a slot for it.
    pub fn slot(&self, pos: usize) -> Option<Slot> {
        if pos >= self.num_tokens {
            return None;
        }
        let block = *self.blocks.get(pos / self.block_size)? as usize;
        Some(block * self.block_size + pos % self.block_size)
    }

    /// Free blocks an `append_slots(n)` would take (new blocks plus a copy-on-write block).
    pub fn blocks_needed(&self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        let new = (self.num_tokens + n).div_ceil(self.block_size) - self.blocks.len();
        new + usize::from(self.needs_cow())
    }

    fn needs_cow(&self) -> bool {
        let offset_in_last = self.num_tokens % self.block_size;
        offset_in_last != 0
            && self
                .blocks
                .last()
                .is_some_and(|&b| self.pool.borrow().ref_count(b) > 1)
    }

    /// Reserves slots for `n` more tokens, allocating blocks as needed and making the partial
    /// last block writable first (see the module docs). All or nothing: on `OutOfBlocks` the
    /// table and pool are unchanged.
    pub fn append_slots(&mut self, n: usize) -> Result<AppendedSlots, OutOfBlocks> {
        if n == 0 {
            return Ok(AppendedSlots::default());
        }
        let needed = self.blocks_needed(n);
        let cow = self.needs_cow();
        let bs = self.block_size;
        let mut pool = self.pool.0.borrow_mut();
        if pool.num_free_blocks() < needed {
            return Err(OutOfBlocks {
                needed,
                free: pool.num_free_blocks(),
            });
        }
        let mut copy = None;
        let offset = self.num_tokens % bs;
        if let (true, Some(last)) = (offset != 0, self.blocks.last_mut()) {
            if cow {
                let dst = pool.allocate().ok_or(OutOfBlocks { needed, free: 0 })?;
                // The partial last block is read by the next query, so within the horizon.
                debug_assert!(self.horizon < self.num_tokens.div_ceil(bs));
                pool.local.unhold(*last);
                pool.release(*last);
                copy = Some(CopyOp {
                    src_block: *last,
                    dst_block: dst,
                    num_tokens: offset,
                });
                *last = dst;
            } else {
                pool.uncache(*last);
            }
        }
        let total_blocks = (self.num_tokens + n).div_ceil(bs);
        while self.blocks.len() < total_blocks {
            let id = pool.allocate().ok_or(OutOfBlocks { needed, free: 0 })?;
            self.blocks.push(id);
        }
        let slots: Vec<Slot> = (self.num_tokens..self.num_tokens + n)
            .map(|pos| {
                let block = self.blocks[pos / bs];
                debug_assert!(
                    pool.is_writable(block),
                    "write into block {block} with ref_cnt {} or cached",
                    pool.ref_count(block)
                );
                block as usize * bs + pos % bs
            })
            .collect();
        self.num_tokens += n;
        Ok(AppendedSlots { slots, copy })
    }

    /// A second handle on the same tokens sharing every block (ref counts bumped). Never
    /// allocates; the first write into a shared partial block copies it.
    pub fn fork(&self) -> BlockTable {
        let mut pool = self.pool.0.borrow_mut();
        for (i, &id) in self.blocks.iter().enumerate() {
            pool.touch(id);
            if self.needs_local(i) {
                pool.local.hold(id);
            }
        }
        BlockTable {
            pool: self.pool.clone(),
            block_size: self.block_size,
            blocks: self.blocks.clone(),
            num_tokens: self.num_tokens,
            salt: self.salt,
            cached: self.cached.clone(),
            cache_stopped: self.cache_stopped,
            no_cache_from: self.no_cache_from,
            horizon: self.horizon,
            kept: self.kept.clone(),
        }
    }

    /// Keeps the first `num_tokens` tokens and releases the blocks past them; a no-op when the
    /// table holds no more than that. The horizon comes back to what a query at `num_tokens`
    /// reads: cut to no more than [`BlockTable::usable_len`], or that query reads released KV.
    pub fn truncate(&mut self, num_tokens: usize) {
        if num_tokens >= self.num_tokens {
            return;
        }
        let keep = num_tokens.div_ceil(self.block_size);
        let mut pool = self.pool.0.borrow_mut();
        for i in (keep..self.blocks.len()).rev() {
            if self.needs_local(i) {
                pool.local.unhold(self.blocks[i]);
            }
            pool.release(self.blocks[i]);
        }
        self.blocks.truncate(keep);
        let back = pool.local.first_needed_block(num_tokens).min(self.horizon);
        for i in back..self.horizon.min(keep) {
            if !self.kept.contains(&i) {
                pool.local.hold(self.blocks[i]);
            }
        }
        self.horizon = back.min(keep);
        self.kept = self.kept.start.min(self.horizon)..self.kept.end.min(self.horizon);
        self.cached.truncate(num_tokens / self.block_size);
        self.num_tokens = num_tokens;
        self.cache_stopped = false;
    }

    /// Registers the full blocks covered by `tokens` in the prefix cache. `tokens` are this
    /// sequence's tokens from position 0 whose KV has been written (pass only computed tokens:
    /// a cached block is promised to hold their KV). Returns the committed block count.
    pub fn commit_full_blocks(&mut self, tokens: &[u32]) -> usize {
        let bs = self.block_size;
        let full = tokens.len().min(self.num_tokens).min(self.no_cache_from) / bs;
        let mut pool = self.pool.0.borrow_mut();
        while !self.cache_stopped && self.cached.len() < full {
            let i = self.cached.len();
            let parent = self.cached.last().copied();
            let chunk = &tokens[i * bs..(i + 1) * bs];
            match pool.cache_full_block(self.blocks[i], parent, chunk, self.salt) {
                Some(c) => self.cached.push(c),
                None => self.cache_stopped = true,
            }
        }
        self.cached.len()
    }

    /// Keep the blocks from token `pos` on out of the prefix cache (see `no_cache_from`).
    pub fn stop_caching_from(&mut self, pos: usize) {
        self.no_cache_from = self.no_cache_from.min(pos);
    }

    /// Shape checks for the invariant checker.
    pub(crate) fn check_shape(&self, block_size: usize) -> Result<(), String> {
        if self.block_size != block_size {
            return Err("table block size differs from the pool's".into());
        }
        if self.blocks.len() != self.num_tokens.div_ceil(block_size) {
            return Err(format!(
                "table has {} blocks for {} tokens",
                self.blocks.len(),
                self.num_tokens
            ));
        }
        if self.horizon > self.blocks.len() {
            return Err(format!(
                "table's horizon {} is past its {} blocks",
                self.horizon,
                self.blocks.len()
            ));
        }
        if self.cached.len() > self.num_tokens / block_size {
            return Err(format!(
                "table commits {} blocks but has {} full",
                self.cached.len(),
                self.num_tokens / block_size
            ));
        }
        Ok(())
    }
}

impl Drop for BlockTable {
    fn drop(&mut self) {
        let mut pool = self.pool.0.borrow_mut();
        for (i, &id) in self.blocks.iter().enumerate().rev() {
            if self.needs_local(i) {
                pool.local.unhold(id);
            }
            pool.release(id);
        }
    }
}

impl std::fmt::Debug for BlockTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockTable")
            .field("num_tokens", &self.num_tokens)
            .field("blocks", &self.blocks)
            .field("committed", &self.cached.len())
            .field("horizon", &self.horizon)
            .field("kept", &self.kept)
            .field("salt", &self.salt)
            .finish()
    }
}
