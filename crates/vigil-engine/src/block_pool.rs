//! Paged KV block accounting: ref counts, the chain-hash prefix cache and the LRU free list.
//!
//! The pool hands out fixed-size blocks of KV rows by `u32` id. It knows nothing about tensors:
//! the runner owns the KV memory and this pool only decides which rows belong to whom. It is
//! single-threaded on purpose (the engine thread owns it); sequences hold blocks through
//! [`BlockTable`](crate::block_table::BlockTable) handles that release their refs on `Drop`.
//!
//! Layout follows vLLM v1: a flat `Vec` of blocks, each with a ref count and an intrusive
//! doubly-linked free list ordered by eviction priority (head is evicted first). A freed block
//! keeps its cache entry until it is handed out again (lazy eviction), so a later request with the
//! same prefix can revive it.
//!
//! Cache hits are exact, not probabilistic. A cached block stores its token ids, its salt and the
//! identity of its parent block (`id` plus a generation that changes whenever that block's cache
//! entry is evicted), and every hit compares all three. By induction along the chain a hit
//! therefore holds exactly the same tokens after exactly the same prefix, whatever the hash does;
//! the hash only finds the candidate.
//!
//! For models with sliding-window layers the pool also tracks which blocks' local-layer KV no
//! table needs any more (`local_kv`); the blocks themselves stay held for the global layers.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use crate::block_table::BlockTable;
use crate::local_kv::LocalKv;

/// Index of one KV block in the pool.
pub type BlockId = u32;
/// Chain hash of a full block: (parent's hash, this block's token ids, salt).
pub type BlockHash = u64;
/// A block hasher: `(parent hash, token ids, salt) -> hash`. Swappable for tests and for a
/// hash that must be stable across processes.
pub type BlockHasher = fn(Option<BlockHash>, &[u32], u64) -> BlockHash;

const NIL: BlockId = BlockId::MAX;

/// The identity of a block as registered in the prefix cache. Valid only while `gen` matches the
/// block's current generation; a chain of these is what a sequence's cached prefix is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachedBlock {
    pub id: BlockId,
    pub gen: u32,
    pub hash: BlockHash,
}

/// What a cached block was registered under; compared in full on every hit.
#[derive(Clone, Copy, Debug)]
struct CacheKey {
    hash: BlockHash,
    parent: Option<CachedBlock>,
    salt: u64,
}

#[derive(Debug)]
struct Block {
    ref_cnt: u32,
    /// Bumped each time the block's cache entry is evicted, so stale parent links never match.
    gen: u32,
    key: Option<CacheKey>,
    /// The token ids of a cached block (empty otherwise); the capacity is kept across reuse.
    tokens: Vec<u32>,
    in_free_list: bool,
    prev: BlockId,
    next: BlockId,
}

/// The pool of KV blocks. See the module docs.
pub struct BlockPool {
    block_size: usize,
    blocks: Vec<Block>,
    free_head: BlockId,
    free_tail: BlockId,
    num_free: usize,
    cache: HashMap<BlockHash, BlockId>,
    hasher: BlockHasher,
    pub(crate) local: LocalKv,
}

/// The default block hasher: SipHash-1-3 with fixed keys over (parent, salt, tokens).
/// Deterministic within one build; hits do not rely on it being collision-free.
pub fn default_block_hash(parent: Option<BlockHash>, tokens: &[u32], salt: u64) -> BlockHash {
    let mut h = std::hash::DefaultHasher::new();
    parent.hash(&mut h);
    salt.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

impl BlockPool {
    /// A pool of `num_blocks` blocks of `block_size` tokens, all free.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Self::with_hasher(num_blocks, block_size, default_block_hash)
    }

    /// Like [`BlockPool::new`] with a chosen block hasher (tests use a colliding one).
    pub fn with_hasher(num_blocks: usize, block_size: usize, hasher: BlockHasher) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        assert!(num_blocks < NIL as usize, "too many blocks for u32 ids");
        let blocks = (0..num_blocks)
            .map(|_| Block {
                ref_cnt: 0,
                gen: 0,
                key: None,
                tokens: Vec::new(),
                in_free_list: false,
                prev: NIL,
                next: NIL,
            })
            .collect();
        let mut pool = Self {
            block_size,
            blocks,
            free_head: NIL,
            free_tail: NIL,
            num_free: 0,
            cache: HashMap::new(),
            hasher,
            local: LocalKv::new(num_blocks, block_size),
        };
        for id in 0..num_blocks as BlockId {
            pool.push_back(id);
        }
        pool
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The sliding window of the model's local layers, when blocks slid past are released.
    pub fn local_window(&self) -> Option<usize> {
        self.local.window()
    }

    /// Release the local-layer KV of blocks that every table has slid past, for a model
    /// whose local layers see `window` keys (`None`: keep everything). Only before any block
    /// is taken: tables keep their horizons under one window.
    pub fn set_local_window(&mut self, window: Option<usize>) -> bool {
        if self.num_used_blocks() > 0 {
            return false;
        }
        self.local.set_window(window);
        true
    }

    /// Whether `id`'s local-layer KV was released (see `local_kv`).
    pub fn is_local_released(&self, id: BlockId) -> bool {
        self.local.is_released(id)
    }

    /// Held blocks whose local-layer KV is released: only their global layers take memory.
    pub fn num_local_released_blocks(&self) -> usize {
        (0..self.blocks.len() as BlockId)
            .filter(|&id| self.blocks[id as usize].ref_cnt > 0 && self.local.is_released(id))
            .count()
    }

    /// The blocks released since the last call, for the runner to give their local-layer
    /// pages back.
    pub fn take_local_released(&mut self) -> Vec<BlockId> {
        self.local.take_released()
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks with no holder, including cached ones that can still be revived by a hit.
    pub fn num_free_blocks(&self) -> usize {
        self.num_free
    }

    pub fn num_used_blocks(&self) -> usize {
        self.blocks.len() - self.num_free
    }

    /// Fraction of blocks held by some table, in `[0, 1]`.
    pub fn usage(&self) -> f32 {
        if self.blocks.is_empty() {
            return 0.0;
        }
        self.num_used_blocks() as f32 / self.blocks.len() as f32
    }

    /// Blocks registered in the prefix cache (held or free).
    pub fn num_cached_blocks(&self) -> usize {
        self.cache.len()
    }

    /// Admission check: can `num_new_blocks` be taken and still leave `watermark_blocks` free?
    pub fn can_allocate(&self, num_new_blocks: usize, watermark_blocks: usize) -> bool {
        self.num_free >= num_new_blocks.saturating_add(watermark_blocks)
    }

    /// The watermark as a block count: `fraction` of the pool, rounded up.
    pub fn watermark_blocks(&self, fraction: f32) -> usize {
        (self.blocks.len() as f32 * fraction.clamp(0.0, 1.0)).ceil() as usize
    }

    /// How many leading prompt tokens a prefix hit may cover: whole blocks, and never the last
    /// token, so every request computes at least one token and gets logits (a full hit would
    /// otherwise give a zero-length query).
    pub fn max_prefix_hit_tokens(&self, prompt_len: usize) -> usize {
        prompt_len.saturating_sub(1) / self.block_size * self.block_size
    }

    pub fn ref_count(&self, id: BlockId) -> u32 {
        self.blocks[id as usize].ref_cnt
    }

    pub fn is_cached(&self, id: BlockId) -> bool {
        self.blocks[id as usize].key.is_some()
    }

    /// May the holder of `id` write KV into it? Only when it is the sole holder and the block's
    /// contents are not promised to the prefix cache.
    pub fn is_writable(&self, id: BlockId) -> bool {
        let b = &self.blocks[id as usize];
        b.ref_cnt == 1 && b.key.is_none()
    }

    /// The longest run of cached full blocks that hold exactly `tokens` (whole blocks only; a
    /// trailing partial block is ignored) under `salt`. Takes no refs.
    pub fn lookup_prefix(&self, tokens: &[u32], salt: u64) -> Vec<BlockId> {
        self.lookup_prefix_chain(tokens, salt)
            .into_iter()
            .map(|c| c.id)
            .collect()
    }

    /// [`BlockPool::lookup_prefix`] returning each hit's cache identity.
    pub fn lookup_prefix_chain(&self, tokens: &[u32], salt: u64) -> Vec<CachedBlock> {
        let mut hits = Vec::new();
        let mut parent: Option<CachedBlock> = None;
        for chunk in tokens.chunks_exact(self.block_size) {
            let hash = (self.hasher)(parent.map(|p| p.hash), chunk, salt);
            match self.find_cached(hash, parent, chunk, salt) {
                Some(hit) => {
                    hits.push(hit);
                    parent = Some(hit);
                }
                None => break,
            }
        }
        hits
    }

    /// The cached block registered under exactly this key, if any.
    fn find_cached(
        &self,
        hash: BlockHash,
        parent: Option<CachedBlock>,
        tokens: &[u32],
        salt: u64,
    ) -> Option<CachedBlock> {
        let &id = self.cache.get(&hash)?;
        let b = &self.blocks[id as usize];
        let key = b.key?;
        let same = key.hash == hash && key.salt == salt && key.parent == parent;
        (same && b.tokens == tokens).then_some(CachedBlock {
            id,
            gen: b.gen,
            hash,
        })
    }

    /// Registers the full block `id` (held by the caller) as holding `tokens` after the cached
    /// chain ending at `parent`. Returns the identity to chain the next block on:
    /// - `id`'s own, when it was registered (or already was, under this key);
    /// - another block's, when an identical block is already cached (`id` stays uncached);
    /// - `None` when a different block sits under the same hash (a collision) or `parent` has
    ///   been evicted since: nothing is registered and the chain cannot continue.
    pub(crate) fn cache_full_block(
        &mut self,
        id: BlockId,
        parent: Option<CachedBlock>,
        tokens: &[u32],
        salt: u64,
    ) -> Option<CachedBlock> {
        assert_eq!(tokens.len(), self.block_size, "only full blocks are cached");
        debug_assert!(self.blocks[id as usize].ref_cnt > 0, "caching a free block");
        if let Some(p) = parent {
            // A parent evicted since the caller chained on it makes this entry unreachable.
            let pb = &self.blocks[p.id as usize];
            if pb.gen != p.gen || pb.key.map(|k| k.hash) != Some(p.hash) {
                return None;
            }
        }
        let hash = (self.hasher)(parent.map(|p| p.hash), tokens, salt);
        if let Some(existing) = self.find_cached(hash, parent, tokens, salt) {
            return Some(existing);
        }
        if self.cache.contains_key(&hash) || self.blocks[id as usize].key.is_some() {
            return None;
        }
        let b = &mut self.blocks[id as usize];
        b.key = Some(CacheKey { hash, parent, salt });
        b.tokens.clear();
        b.tokens.extend_from_slice(tokens);
        self.cache.insert(hash, id);
        Some(CachedBlock {
            id,
            gen: b.gen,
            hash,
        })
    }

    /// Takes the block at the head of the free list (evicting its cache entry) with one ref.
    pub(crate) fn allocate(&mut self) -> Option<BlockId> {
        let id = self.free_head;
        if id == NIL {
            return None;
        }
        self.unlink(id);
        self.uncache(id);
        self.blocks[id as usize].ref_cnt = 1;
        self.local.on_allocate(id);
        Some(id)
    }

    /// Takes one more ref on `id`, reviving it from the free list if it was free.
    pub(crate) fn touch(&mut self, id: BlockId) {
        if self.blocks[id as usize].ref_cnt == 0 {
            self.unlink(id);
        }
        self.blocks[id as usize].ref_cnt += 1;
    }

    /// Drops one ref on `id`. A block left with none goes to the free list: cached blocks at the
    /// tail (evicted last), uncached ones at the head (nothing to lose, so reused first).
    pub(crate) fn release(&mut self, id: BlockId) {
        let b = &mut self.blocks[id as usize];
        assert!(b.ref_cnt > 0, "release of free block {id}");
        b.ref_cnt -= 1;
        if b.ref_cnt == 0 {
            if b.key.is_some() {
                self.push_back(id);
            } else {
                self.push_front(id);
            }
        }
    }

    /// Removes `id`'s cache entry (if any) so its rows may be overwritten.
    pub(crate) fn uncache(&mut self, id: BlockId) {
        let b = &mut self.blocks[id as usize];
        if let Some(key) = b.key.take() {
            b.tokens.clear();
            b.gen = b.gen.wrapping_add(1);
            if self.cache.get(&key.hash) == Some(&id) {
                self.cache.remove(&key.hash);
            }
        }
    }

    fn push_back(&mut self, id: BlockId) {
        let tail = self.free_tail;
        let b = &mut self.blocks[id as usize];
        debug_assert!(!b.in_free_list);
        b.in_free_list = true;
        b.prev = tail;
        b.next = NIL;
        if tail == NIL {
            self.free_head = id;
        } else {
            self.blocks[tail as usize].next = id;
        }
        self.free_tail = id;
        self.num_free += 1;
    }

    fn push_front(&mut self, id: BlockId) {
        let head = self.free_head;
        let b = &mut self.blocks[id as usize];
        debug_assert!(!b.in_free_list);
        b.in_free_list = true;
        b.prev = NIL;
        b.next = head;
        if head == NIL {
            self.free_tail = id;
        } else {
            self.blocks[head as usize].prev = id;
        }
        self.free_head = id;
        self.num_free += 1;
    }

    fn unlink(&mut self, id: BlockId) {
        let b = &mut self.blocks[id as usize];
        debug_assert!(b.in_free_list);
        let (prev, next) = (b.prev, b.next);
        b.in_free_list = false;
        b.prev = NIL;
        b.next = NIL;
        if prev == NIL {
            self.free_head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.free_tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        self.num_free -= 1;
    }

    /// The free list from head (evicted first) to tail.
    pub fn free_list(&self) -> Vec<BlockId> {
        let mut out = Vec::with_capacity(self.num_free);
        let mut id = self.free_head;
        while id != NIL && out.len() <= self.blocks.len() {
            out.push(id);
            id = self.blocks[id as usize].next;
        }
        out
    }

    /// Checks the accounting against every live table of this pool (pass them all): each
    /// block's ref count equals the number of tables holding it; the free list is well linked
    /// and holds exactly the blocks with no refs; free + used = all; the hash map and the
    /// blocks' cache keys agree; each table's shape matches its token count; each block's
    /// local holders are the tables holding it for its local KV (at or past their horizon, or
    /// kept), and none of those blocks has its local KV released.
    pub fn check_invariants(&self, tables: &[&BlockTable]) -> Result<(), String> {
        let n = self.blocks.len();
        let mut holders = vec![0u32; n];
        let mut local_holders = vec![0u32; n];
        for (t, table) in tables.iter().enumerate() {
            table.check_shape(self.block_size)?;
            for (i, &id) in table.block_ids().iter().enumerate() {
                if !table.needs_local(i) || id as usize >= n {
                    continue;
                }
                local_holders[id as usize] += 1;
                if self.local.is_released(id) {
                    return Err(format!(
                        "table {t} needs block {i} ({id}) whose local KV was released"
                    ));
                }
            }
            let mut ids = table.block_ids().to_vec();
            ids.sort_unstable();
            if ids.windows(2).any(|w| w[0] == w[1]) {
                return Err(format!("table {t} holds a block twice"));
            }
            for (i, c) in table.cached_chain().iter().enumerate() {
                let own = table.block_ids().get(i) == Some(&c.id);
                let b = self.blocks.get(c.id as usize);
                if own && b.is_none_or(|b| b.gen != c.gen || b.key.map(|k| k.hash) != Some(c.hash))
                {
                    return Err(format!(
                        "table {t} block {i}: its cache identity went stale"
                    ));
                }
            }
            for &id in table.block_ids() {
                *holders
                    .get_mut(id as usize)
                    .ok_or_else(|| format!("table {t} holds unknown block {id}"))? += 1;
            }
        }
        for (id, b) in self.blocks.iter().enumerate() {
            if b.ref_cnt != holders[id] {
                return Err(format!(
                    "block {id}: ref_cnt {} but {} tables hold it",
                    b.ref_cnt, holders[id]
                ));
            }
            if self.local.holders(id as BlockId) != local_holders[id] {
                return Err(format!(
                    "block {id}: {} local holders but {} tables need it",
                    self.local.holders(id as BlockId),
                    local_holders[id]
                ));
            }
            if b.in_free_list != (b.ref_cnt == 0) {
                return Err(format!(
                    "block {id}: ref_cnt {} but in_free_list {}",
                    b.ref_cnt, b.in_free_list
                ));
            }
            match b.key {
                Some(key) => {
                    if self.cache.get(&key.hash) != Some(&(id as BlockId)) {
                        return Err(format!("cached block {id} is missing from the hash map"));
                    }
                    if b.tokens.len() != self.block_size {
                        return Err(format!("cached block {id} holds {} tokens", b.tokens.len()));
                    }
                }
                None if !b.tokens.is_empty() => {
                    return Err(format!("uncached block {id} keeps tokens"));
                }
                None => {}
            }
        }
        for (&hash, &id) in &self.cache {
            let stored = self.blocks.get(id as usize).and_then(|b| b.key);
            if stored.map(|k| k.hash) != Some(hash) {
                return Err(format!(
                    "hash map entry {hash:#x} -> {id}: block's hash differs"
                ));
            }
        }
        let list = self.free_list();
        if list.len() != self.num_free {
            return Err(format!(
                "free list has {} blocks, counter says {}",
                list.len(),
                self.num_free
            ));
        }
        let mut prev = NIL;
        for &id in &list {
            let b = &self.blocks[id as usize];
            if b.prev != prev || !b.in_free_list || b.ref_cnt != 0 {
                return Err(format!("free list broken at block {id}"));
            }
            prev = id;
        }
        if self.free_tail != prev {
            return Err("free list tail does not match its last block".into());
        }
        let used = self.blocks.iter().filter(|b| b.ref_cnt > 0).count();
        if used + self.num_free != n {
            return Err(format!(
                "{used} used + {} free != {n} blocks",
                self.num_free
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_takes_head_and_release_orders_by_cache_state() {
        let mut pool = BlockPool::new(4, 2);
        assert_eq!(pool.free_list(), vec![0, 1, 2, 3]);
        let a = pool.allocate().unwrap();
        let b = pool.allocate().unwrap();
        assert_eq!((a, b), (0, 1));
        assert_eq!(pool.num_used_blocks(), 2);
        assert!(pool.cache_full_block(a, None, &[7, 8], 0).is_some());
        for id in [a, b] {
            // What a table dropping its block does: it no longer needs its local KV either.
            pool.local.unhold(id);
        }
        pool.release(a); // cached: tail
        pool.release(b); // uncached: head
        assert_eq!(pool.free_list(), vec![1, 2, 3, 0]);
        assert_eq!(pool.num_free_blocks(), 4);
        assert_eq!(pool.check_invariants(&[]), Ok(()));
    }

    #[test]
    fn touch_revives_a_free_cached_block_from_the_middle() {
        let mut pool = BlockPool::new(3, 1);
        let ids: Vec<_> = (0..3).map(|_| pool.allocate().unwrap()).collect();
        let mut parent = None;
        for (i, &id) in ids.iter().enumerate() {
            parent = pool.cache_full_block(id, parent, &[i as u32], 0);
        }
        for &id in &ids {
            pool.release(id);
        }
        assert_eq!(pool.lookup_prefix(&[0, 1, 2], 0), ids);
        pool.touch(1);
        assert_eq!(pool.free_list(), vec![0, 2]);
        assert_eq!(pool.ref_count(1), 1);
        pool.release(1);
        assert_eq!(pool.free_list(), vec![0, 2, 1]);
    }

    #[test]
    fn allocation_evicts_the_cache_entry_lazily() {
        let mut pool = BlockPool::new(1, 2);
        let id = pool.allocate().unwrap();
        pool.cache_full_block(id, None, &[1, 2], 0);
        pool.release(id);
        assert_eq!(pool.lookup_prefix(&[1, 2], 0), vec![id]);
        assert_eq!(pool.allocate(), Some(id));
        assert!(pool.lookup_prefix(&[1, 2], 0).is_empty());
        assert_eq!(pool.num_cached_blocks(), 0);
        assert_eq!(pool.allocate(), None);
    }
}
