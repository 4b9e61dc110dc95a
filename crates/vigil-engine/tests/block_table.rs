//! Block tables over the pool: append, prefix hits, fork with copy-on-write, truncate, drop,
//! and prefix hits that stay exact when the hash collides.

use vigil_engine::block_pool::{BlockHash, BlockPool};
use vigil_engine::block_table::{BlockTable, CopyOp, OutOfBlocks, SharedBlockPool};

fn ok(pool: &SharedBlockPool, tables: &[&BlockTable]) {
    if let Err(e) = pool.check_invariants(tables) {
        panic!("invariant broken: {e}");
    }
}

/// A table holding `tokens`, committed to the cache.
fn filled(pool: &SharedBlockPool, tokens: &[u32], salt: u64) -> BlockTable {
    let mut t = pool.new_table(salt);
    let _ = t.append_slots(tokens.len()).unwrap();
    t.commit_full_blocks(tokens);
    t
}

#[test]
fn append_allocates_blocks_and_maps_slots() {
    let pool = SharedBlockPool::new(8, 4);
    let mut t = pool.new_table(0);
    let a = t.append_slots(6).unwrap();
    assert_eq!(a.copy, None);
    let b = t.block_ids().to_vec();
    assert_eq!(b.len(), 2);
    let want: Vec<usize> = (0..6).map(|p| b[p / 4] as usize * 4 + p % 4).collect();
    assert_eq!(a.slots, want);
    assert_eq!(t.slot(5), Some(want[5]));
    assert_eq!(t.slot(6), None);
    let c = t.append_slots(3).unwrap();
    assert_eq!(c.slots.len(), 3);
    assert_eq!(t.block_ids().len(), 3);
    assert_eq!(t.block_ids()[..2], b[..]);
    assert_eq!(t.num_tokens(), 9);
    assert_eq!(pool.borrow().num_used_blocks(), 3);
    assert_eq!(pool.borrow().num_free_blocks(), 5);
    assert!((pool.borrow().usage() - 3.0 / 8.0).abs() < 1e-6);
    assert_eq!(t.append_slots(0).unwrap().slots, Vec::<usize>::new());
    ok(&pool, &[&t]);
}

#[test]
fn out_of_blocks_leaves_everything_unchanged() {
    let pool = SharedBlockPool::new(2, 4);
    let mut t = pool.new_table(0);
    let _ = t.append_slots(5).unwrap();
    assert_eq!(t.blocks_needed(4), 1);
    assert_eq!(t.append_slots(4), Err(OutOfBlocks { needed: 1, free: 0 }));
    assert_eq!(t.num_tokens(), 5);
    assert_eq!(t.append_slots(3).unwrap().slots.len(), 3);
    ok(&pool, &[&t]);
    assert!(!pool.borrow().can_allocate(1, 0));
}

#[test]
fn watermark_and_prefix_limit_helpers() {
    let pool = BlockPool::new(100, 16);
    assert_eq!(pool.watermark_blocks(0.01), 1);
    assert!(pool.can_allocate(99, 1));
    assert!(!pool.can_allocate(100, 1));
    // Never the last token: a 32-token prompt may hit only its first block.
    assert_eq!(pool.max_prefix_hit_tokens(32), 16);
    assert_eq!(pool.max_prefix_hit_tokens(33), 32);
    assert_eq!(pool.max_prefix_hit_tokens(0), 0);
}

#[test]
fn prefix_hit_reuses_blocks_and_recomputes_the_last_token() {
    let pool = SharedBlockPool::new(16, 4);
    let prompt: Vec<u32> = (100..112).collect(); // 3 full blocks
    let first = filled(&pool, &prompt, 0);
    assert_eq!(first.num_committed_blocks(), 3);
    assert_eq!(pool.borrow().num_cached_blocks(), 3);
    // Same prompt: the last block is left to recompute.
    let hit = pool.table_with_prefix(&prompt, 0);
    assert_eq!(hit.num_tokens(), 8);
    assert_eq!(hit.block_ids(), &first.block_ids()[..2]);
    // Longer prompt sharing all three blocks.
    let mut longer = prompt.clone();
    longer.extend([1, 2]);
    let hit2 = pool.table_with_prefix(&longer, 0);
    assert_eq!(hit2.block_ids(), first.block_ids());
    assert_eq!(pool.borrow().ref_count(first.block_ids()[0]), 3);
    // Another salt, or a different first block, misses.
    assert_eq!(pool.table_with_prefix(&longer, 1).num_tokens(), 0);
    let mut other = longer.clone();
    other[0] = 7;
    assert_eq!(pool.table_with_prefix(&other, 0).num_tokens(), 0);
    // Diverging in the second block hits only the first.
    let mut diverge = longer.clone();
    diverge[5] = 7;
    assert_eq!(pool.table_with_prefix(&diverge, 0).num_tokens(), 4);
    ok(&pool, &[&first, &hit, &hit2]);
}

#[test]
fn freed_blocks_keep_their_hash_until_reused() {
    let pool = SharedBlockPool::new(4, 2);
    let ids = filled(&pool, &[1, 2, 3, 4], 0).block_ids().to_vec();
    assert_eq!(pool.borrow().num_used_blocks(), 0);
    assert_eq!(pool.borrow().lookup_prefix(&[1, 2, 3, 4], 0), ids);
    let revived = pool.table_with_prefix(&[1, 2, 3, 4, 5], 0);
    assert_eq!(revived.block_ids(), &ids[..]);
    drop(revived);
    // Filling the pool evicts them: uncached free blocks go first, then the LRU cached ones.
    let mut hog = pool.new_table(0);
    let _ = hog.append_slots(6).unwrap();
    assert_eq!(pool.borrow().lookup_prefix(&[1, 2, 3, 4], 0), ids[..1]);
    let _ = hog.append_slots(2).unwrap();
    assert!(pool.borrow().lookup_prefix(&[1, 2, 3, 4], 0).is_empty());
    ok(&pool, &[&hog]);
}

#[test]
fn identical_content_committed_twice_is_cached_once() {
    let pool = SharedBlockPool::new(8, 2);
    let a = filled(&pool, &[1, 2, 3, 4], 0);
    let b = filled(&pool, &[1, 2, 3, 4, 5, 6], 0);
    assert_eq!(b.num_committed_blocks(), 3);
    assert_eq!(pool.borrow().num_cached_blocks(), 3);
    // The chain continues from a's canonical blocks: b's third block is reachable.
    let hits = pool.borrow().lookup_prefix(&[1, 2, 3, 4, 5, 6], 0);
    assert_eq!(hits[..2], a.block_ids()[..]);
    assert_eq!(hits[2], b.block_ids()[2]);
    ok(&pool, &[&a, &b]);
}

/// Every hash collides: only the stored tokens tell blocks apart, and they must.
#[test]
fn colliding_hash_never_returns_wrong_blocks() {
    fn constant(_: Option<BlockHash>, _: &[u32], _: u64) -> BlockHash {
        42
    }
    let pool = SharedBlockPool::from_pool(BlockPool::with_hasher(8, 2, constant));
    let a = filled(&pool, &[1, 2, 3, 4], 0);
    // Block 1 collided with block 0's entry: only block 0 is cached.
    assert_eq!(a.num_committed_blocks(), 1);
    assert_eq!(
        pool.borrow().lookup_prefix(&[1, 2, 3, 4], 0),
        a.block_ids()[..1]
    );
    assert!(pool.borrow().lookup_prefix(&[3, 4], 0).is_empty());
    assert!(pool.borrow().lookup_prefix(&[1, 2], 9).is_empty());
    let b = filled(&pool, &[5, 6], 0);
    assert_eq!(b.num_committed_blocks(), 0);
    assert_eq!(pool.table_with_prefix(&[5, 6, 7], 0).num_tokens(), 0);
    ok(&pool, &[&a, &b]);
}

/// The hash ignores the parent: a block with equal tokens after a different prefix must not hit.
#[test]
fn colliding_chain_is_caught_by_the_parent_check() {
    fn tokens_only(_: Option<BlockHash>, tokens: &[u32], salt: u64) -> BlockHash {
        tokens.iter().fold(salt, |h, &t| h * 31 + t as u64)
    }
    let pool = SharedBlockPool::from_pool(BlockPool::with_hasher(8, 2, tokens_only));
    let pz = filled(&pool, &[1, 1, 9, 9], 0); // P, Z
    let q = filled(&pool, &[2, 2], 0); // Q
    assert_eq!(pool.borrow().lookup_prefix(&[2, 2, 9, 9], 0), q.block_ids());
    assert_eq!(
        pool.borrow().lookup_prefix(&[1, 1, 9, 9], 0),
        pz.block_ids()
    );
    ok(&pool, &[&pz, &q]);
}

#[test]
fn fork_shares_blocks_and_copies_the_partial_block_on_first_write() {
    let pool = SharedBlockPool::new(8, 4);
    let mut parent = pool.new_table(0);
    let _ = parent.append_slots(6).unwrap();
    let mut child = parent.fork();
    assert_eq!(child.block_ids(), parent.block_ids());
    assert_eq!(pool.borrow().num_used_blocks(), 2);
    for &b in parent.block_ids() {
        assert_eq!(pool.borrow().ref_count(b), 2);
    }
    ok(&pool, &[&parent, &child]);

    let shared_partial = parent.block_ids()[1];
    assert_eq!(child.blocks_needed(1), 1);
    let c = child.append_slots(1).unwrap();
    let copy = c.copy.expect("shared partial block must be copied");
    assert_eq!(copy.src_block, shared_partial);
    assert_eq!(copy.num_tokens, 2);
    assert_eq!(c.slots, vec![copy.dst_block as usize * 4 + 2]);
    assert_eq!(child.block_ids()[0], parent.block_ids()[0]);
    assert_eq!(child.block_ids()[1], copy.dst_block);
    // The parent is now the partial block's only holder and writes in place.
    let p = parent.append_slots(1).unwrap();
    assert_eq!(p.copy, None);
    assert_eq!(p.slots, vec![shared_partial as usize * 4 + 2]);
    // Writes only ever land in blocks with one holder.
    for slot in c.slots.iter().chain(&p.slots) {
        let block = (slot / 4) as u32;
        assert_eq!(pool.borrow().ref_count(block), 1);
        assert!(pool.borrow().is_writable(block));
    }
    ok(&pool, &[&parent, &child]);
    drop(parent);
    drop(child);
    assert_eq!(pool.borrow().num_used_blocks(), 0);
}

#[test]
fn fork_at_a_block_boundary_needs_no_copy() {
    let pool = SharedBlockPool::new(8, 4);
    let mut parent = pool.new_table(0);
    let _ = parent.append_slots(4).unwrap();
    let mut child = parent.fork();
    let c = child.append_slots(2).unwrap();
    assert_eq!(c.copy, None);
    assert_ne!(child.block_ids()[1], parent.block_ids()[0]);
    ok(&pool, &[&parent, &child]);
}

#[test]
fn out_of_blocks_for_the_copy_on_write_block() {
    let pool = SharedBlockPool::new(2, 4);
    let mut parent = pool.new_table(0);
    let _ = parent.append_slots(6).unwrap();
    let mut child = parent.fork();
    assert_eq!(
        child.append_slots(1),
        Err(OutOfBlocks { needed: 1, free: 0 })
    );
    assert_eq!(child.block_ids(), parent.block_ids());
    ok(&pool, &[&parent, &child]);
}

#[test]
fn truncate_releases_the_tail() {
    let pool = SharedBlockPool::new(8, 4);
    let mut t = pool.new_table(0);
    let _ = t.append_slots(10).unwrap();
    let ids = t.block_ids().to_vec();
    t.truncate(20); // no-op
    assert_eq!(t.num_tokens(), 10);
    t.truncate(5);
    assert_eq!(t.num_tokens(), 5);
    assert_eq!(t.block_ids(), &ids[..2]);
    assert_eq!(pool.borrow().num_used_blocks(), 2);
    t.truncate(4);
    assert_eq!(t.block_ids(), &ids[..1]);
    ok(&pool, &[&t]);
    t.truncate(0);
    assert!(t.block_ids().is_empty());
    assert_eq!(pool.borrow().num_used_blocks(), 0);
    ok(&pool, &[&t]);
}

#[test]
fn writing_into_a_truncated_cached_block_drops_its_cache_entry() {
    let pool = SharedBlockPool::new(8, 4);
    let tokens: Vec<u32> = (0..8).collect();
    let mut t = filled(&pool, &tokens, 0);
    assert_eq!(pool.borrow().num_cached_blocks(), 2);
    t.truncate(6);
    assert_eq!(t.num_committed_blocks(), 1);
    let last = t.block_ids()[1];
    assert!(pool.borrow().is_cached(last));
    let a = t.append_slots(1).unwrap();
    assert_eq!(a.copy, None);
    assert_eq!(a.slots, vec![last as usize * 4 + 2]);
    assert!(!pool.borrow().is_cached(last));
    assert_eq!(pool.borrow().lookup_prefix(&tokens, 0).len(), 1);
    ok(&pool, &[&t]);
}

#[test]
fn writing_into_a_truncated_block_shared_with_a_fork_copies_it() {
    let pool = SharedBlockPool::new(8, 4);
    let mut session = pool.new_table(0);
    let _ = session.append_slots(8).unwrap();
    let fork = session.fork();
    session.truncate(6); // rewind into a block the fork still holds in full
    let a = session.append_slots(1).unwrap();
    assert_eq!(
        a.copy,
        Some(CopyOp {
            src_block: fork.block_ids()[1],
            dst_block: session.block_ids()[1],
            num_tokens: 2,
        })
    );
    assert_eq!(pool.borrow().ref_count(fork.block_ids()[1]), 1);
    ok(&pool, &[&session, &fork]);
}

#[test]
fn drop_releases_every_ref() {
    let pool = SharedBlockPool::new(8, 4);
    {
        let mut t = pool.new_table(0);
        let _ = t.append_slots(9).unwrap();
        let f1 = t.fork();
        let _f2 = f1.fork();
        assert_eq!(pool.borrow().num_used_blocks(), 3);
        assert_eq!(pool.borrow().ref_count(t.block_ids()[0]), 3);
    }
    assert_eq!(pool.borrow().num_used_blocks(), 0);
    assert_eq!(pool.borrow().num_free_blocks(), 8);
    ok(&pool, &[]);
}

#[test]
fn invariant_checker_catches_a_missing_table() {
    let pool = SharedBlockPool::new(4, 4);
    let mut a = pool.new_table(0);
    let _ = a.append_slots(4).unwrap();
    let b = a.fork();
    assert!(pool.check_invariants(&[&a]).is_err());
    assert!(pool.check_invariants(&[&a, &b]).is_ok());
    let other = SharedBlockPool::new(4, 4);
    assert!(other.check_invariants(&[&a]).is_err());
}
