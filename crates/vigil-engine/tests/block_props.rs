//! Randomized property test of block accounting: thousands of seeded operations (new sequence
//! with prefix lookup, append, fork, truncate, drop, commit, lookup) over a small pool, with the
//! invariant checker after every one and a shadow KV store proving that every sequence reads
//! exactly the KV of its own tokens, whether it came from a prefix hit, a fork or a copy.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use vigil_engine::block_pool::{default_block_hash, BlockHash, BlockHasher, BlockPool};
use vigil_engine::block_table::{AppendedSlots, BlockTable, SharedBlockPool};

/// A sequence: its table and the tokens whose KV it holds (`tokens.len() == num_tokens()`).
struct Seq {
    table: BlockTable,
    tokens: Vec<u32>,
}

/// What the KV row of token `p` holds: a fingerprint of the salt and `tokens[..=p]`. The salt
/// stands for anything that changes KV for equal tokens (an adapter), so a hit across salts
/// shows up as wrong KV.
fn fingerprints(salt: u64, tokens: &[u32]) -> Vec<u64> {
    let mut h = salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xABCD;
    tokens
        .iter()
        .map(|&t| {
            h = (h ^ t as u64).wrapping_mul(0x100_0000_01B3).rotate_left(17);
            h
        })
        .collect()
}

#[derive(Default, Debug)]
struct Stats {
    hit_blocks: usize,
    copies: usize,
    out_of_blocks: usize,
    forks: usize,
    truncates: usize,
}

struct World {
    pool: SharedBlockPool,
    bs: usize,
    kv: Vec<u64>,
    seqs: Vec<Seq>,
    stats: Stats,
}

impl World {
    /// Mirrors what the runner does with an append: the copy first, then the new rows.
    fn write(&mut self, a: &AppendedSlots, seq: usize, new_tokens: &[u32]) {
        if let Some(c) = a.copy {
            self.stats.copies += 1;
            let (src, dst) = (
                c.src_block as usize * self.bs,
                c.dst_block as usize * self.bs,
            );
            for o in 0..c.num_tokens {
                self.kv[dst + o] = self.kv[src + o];
            }
        }
        let s = &mut self.seqs[seq];
        let start = s.tokens.len();
        s.tokens.extend_from_slice(new_tokens);
        let fp = fingerprints(s.table.salt(), &s.tokens);
        for (i, &slot) in a.slots.iter().enumerate() {
            self.kv[slot] = fp[start + i];
        }
    }

    fn append(&mut self, seq: usize, new_tokens: &[u32]) -> bool {
        match self.seqs[seq].table.append_slots(new_tokens.len()) {
            Ok(a) => {
                self.write(&a, seq, new_tokens);
                true
            }
            Err(_) => {
                self.stats.out_of_blocks += 1;
                false
            }
        }
    }

    fn check(&self, step: usize) {
        let tables: Vec<&BlockTable> = self.seqs.iter().map(|s| &s.table).collect();
        if let Err(e) = self.pool.check_invariants(&tables) {
            panic!("step {step}: {e}");
        }
        for (i, s) in self.seqs.iter().enumerate() {
            assert_eq!(s.tokens.len(), s.table.num_tokens(), "step {step} seq {i}");
            let fp = fingerprints(s.table.salt(), &s.tokens);
            for (p, &want) in fp.iter().enumerate() {
                let slot = s.table.slot(p).unwrap();
                assert_eq!(self.kv[slot], want, "step {step} seq {i} pos {p}: wrong KV");
            }
        }
    }

    /// A pure lookup must only return blocks holding exactly the KV of `tokens`.
    fn check_lookup(&self, tokens: &[u32], salt: u64) -> usize {
        let hits = self.pool.borrow().lookup_prefix(tokens, salt);
        let fp = fingerprints(salt, tokens);
        for (i, &b) in hits.iter().enumerate() {
            for o in 0..self.bs {
                assert_eq!(self.kv[b as usize * self.bs + o], fp[i * self.bs + o]);
            }
        }
        hits.len()
    }
}

fn random_tokens(rng: &mut ChaCha8Rng, n: usize) -> Vec<u32> {
    (0..n).map(|_| rng.random_range(0..3)).collect()
}

fn run(seed: u64, num_blocks: usize, bs: usize, hasher: BlockHasher, ops: usize) -> Stats {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let bases: Vec<Vec<u32>> = (0..6)
        .map(|_| {
            let n = rng.random_range(0..24);
            random_tokens(&mut rng, n)
        })
        .collect();
    let mut w = World {
        pool: SharedBlockPool::from_pool(BlockPool::with_hasher(num_blocks, bs, hasher)),
        bs,
        kv: vec![u64::MAX; num_blocks * bs],
        seqs: Vec::new(),
        stats: Stats::default(),
    };
    let prompt = |rng: &mut ChaCha8Rng| {
        let mut p = bases[rng.random_range(0..bases.len())].clone();
        let n = rng.random_range(0..8);
        p.extend(random_tokens(rng, n));
        p
    };
    for step in 0..ops {
        let op = rng.random_range(0..100);
        let pick = |rng: &mut ChaCha8Rng, n: usize| rng.random_range(0..n);
        match op {
            // New sequence: prefix hit, then prefill the rest (if it fits).
            0..=19 if w.seqs.len() < 24 => {
                let p = prompt(&mut rng);
                let salt = rng.random_range(0..2);
                let table = w.pool.table_with_prefix(&p, salt);
                let hit = table.num_tokens();
                w.stats.hit_blocks += hit / bs;
                w.seqs.push(Seq {
                    table,
                    tokens: p[..hit].to_vec(),
                });
                let i = w.seqs.len() - 1;
                if w.append(i, &p[hit..]) && rng.random_bool(0.7) {
                    w.seqs[i].table.commit_full_blocks(&p);
                }
            }
            20..=44 if !w.seqs.is_empty() => {
                let i = pick(&mut rng, w.seqs.len());
                let n = rng.random_range(1..10);
                let t = random_tokens(&mut rng, n);
                w.append(i, &t);
            }
            45..=54 if !w.seqs.is_empty() && w.seqs.len() < 24 => {
                let i = pick(&mut rng, w.seqs.len());
                let s = &w.seqs[i];
                let child = Seq {
                    table: s.table.fork(),
                    tokens: s.tokens.clone(),
                };
                w.seqs.push(child);
                w.stats.forks += 1;
            }
            55..=64 if !w.seqs.is_empty() => {
                let i = pick(&mut rng, w.seqs.len());
                let s = &mut w.seqs[i];
                let n = rng.random_range(0..=s.tokens.len());
                s.table.truncate(n);
                s.tokens.truncate(n);
                w.stats.truncates += 1;
            }
            65..=79 if !w.seqs.is_empty() => {
                let i = pick(&mut rng, w.seqs.len());
                let s = w.seqs.swap_remove(i);
                if rng.random_bool(0.5) {
                    // Preemption registers the computed blocks before freeing.
                    let mut t = s.table;
                    t.commit_full_blocks(&s.tokens);
                }
            }
            80..=89 if !w.seqs.is_empty() => {
                let i = pick(&mut rng, w.seqs.len());
                let s = &mut w.seqs[i];
                let committed = s.table.commit_full_blocks(&s.tokens);
                assert!(committed <= s.tokens.len() / bs);
            }
            _ => {
                let p = prompt(&mut rng);
                let salt = rng.random_range(0..2);
                w.check_lookup(&p, salt);
            }
        }
        w.check(step);
    }
    w.seqs.clear();
    assert_eq!(w.pool.borrow().num_used_blocks(), 0);
    assert_eq!(w.pool.borrow().num_free_blocks(), num_blocks);
    w.pool.check_invariants(&[]).unwrap();
    w.stats
}

fn assert_exercised(s: &Stats) {
    assert!(s.hit_blocks > 50, "{s:?}");
    assert!(s.copies > 20, "{s:?}");
    assert!(s.out_of_blocks > 20, "{s:?}");
    assert!(s.forks > 100 && s.truncates > 100, "{s:?}");
}

#[test]
fn random_ops_keep_accounting_and_kv_exact() {
    assert_exercised(&run(1, 48, 4, default_block_hash, 5000));
}

#[test]
fn random_ops_with_single_token_blocks() {
    // No block is ever partial, so nothing is ever copied.
    let s = run(2, 96, 1, default_block_hash, 5000);
    assert!(
        s.hit_blocks > 50 && s.out_of_blocks > 20 && s.copies == 0,
        "{s:?}"
    );
}

/// A hasher with 5 outputs: collisions everywhere, and hits must still be exact.
#[test]
fn random_ops_with_a_colliding_hash() {
    fn weak(parent: Option<BlockHash>, tokens: &[u32], salt: u64) -> BlockHash {
        (parent.unwrap_or(7) + salt + tokens.iter().map(|&t| t as u64).sum::<u64>()) % 5
    }
    let s = run(3, 48, 2, weak, 5000);
    assert!(s.copies > 20 && s.out_of_blocks > 20, "{s:?}");
}
