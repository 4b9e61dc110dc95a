//! Picks what runs in the next step, vLLM v1's rule: a token budget per step, running
//! sequences first (their next token, or their next prefill chunk), then waiting ones admitted
//! while blocks last above a watermark. Out of blocks → preempt the newest running sequence by
//! recompute (its full blocks stay in the prefix cache, so recompute is mostly hits).

use crate::block_table::SharedBlockPool;
use crate::sequence::{SeqId, SeqStatus, Sequence};
use std::collections::{HashMap, VecDeque};

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Tokens computed per step across all sequences.
    pub max_batched_tokens: usize,
    pub max_seqs: usize,
    /// Fraction of blocks kept free when admitting new sequences.
    pub watermark: f32,
    pub enable_prefix_cache: bool,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_batched_tokens: 512,
            max_seqs: 64,
            watermark: 0.01,
            enable_prefix_cache: true,
        }
    }
}

/// One scheduled sequence and how many of its tokens to compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduledSeq {
    pub seq_id: SeqId,
    pub num_tokens: usize,
}

#[derive(Debug, Default)]
pub struct StepPlan {
    pub seqs: Vec<ScheduledSeq>,
    pub preempted: Vec<SeqId>,
}

pub struct Scheduler {
    pub config: SchedulerConfig,
    pub waiting: VecDeque<SeqId>,
    pub running: Vec<SeqId>,
    pub num_preemptions: u64,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Self {
        Scheduler {
            config,
            waiting: VecDeque::new(),
            running: Vec::new(),
            num_preemptions: 0,
        }
    }

    pub fn add(&mut self, id: SeqId) {
        self.waiting.push_back(id);
    }

    pub fn remove(&mut self, id: SeqId) {
        self.waiting.retain(|&s| s != id);
        self.running.retain(|&s| s != id);
    }

    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    pub fn schedule(
        &mut self,
        seqs: &mut HashMap<SeqId, Sequence>,
        pool: &SharedBlockPool,
    ) -> StepPlan {
        let mut plan = StepPlan::default();
        let mut budget = self.config.max_batched_tokens;
        // Blocks the plan will take when the runner appends; the pool only hands them out then.
        let mut reserved: Vec<(SeqId, usize)> = Vec::new();
        let total = |r: &[(SeqId, usize)]| r.iter().map(|&(_, n)| n).sum::<usize>();

        // Running sequences first, oldest first; preempt from the newest end when blocks run out.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let Some(seq) = seqs.get(&id) else {
                self.running.remove(i);
                continue;
            };
            let n = (seq.num_tokens() - seq.num_computed_tokens).min(budget);
            if n == 0 {
                i += 1;
                continue;
            }
            let needed = seq.table.as_ref().map_or(0, |t| t.blocks_needed(n));
            if needed + total(&reserved) > pool.borrow().num_free_blocks() {
                // Preempt the newest running sequence (possibly this one) and retry.
                let Some(victim) = self.running.pop() else {
                    break;
                };
                self.preempt(victim, seqs);
                plan.preempted.push(victim);
                plan.seqs.retain(|s| s.seq_id != victim);
                reserved.retain(|&(s, _)| s != victim);
                continue;
            }
            reserved.push((id, needed));
            plan.seqs.push(ScheduledSeq {
                seq_id: id,
                num_tokens: n,
            });
            budget -= n;
            i += 1;
        }

        // Then waiting sequences, in arrival order, while budget and blocks last.
        let watermark = pool.borrow().watermark_blocks(self.config.watermark);
        while budget > 0 && self.running.len() < self.config.max_seqs && plan.preempted.is_empty() {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let Some(seq) = seqs.get_mut(&id) else {
                self.waiting.pop_front();
                continue;
            };
            let table = if self.config.enable_prefix_cache {
                pool.table_with_prefix(&seq.token_ids[..seq.num_prompt_tokens], 0)
            } else {
                pool.new_table(0)
            };
            let cached = table.num_tokens();
            let n = (seq.num_tokens() - cached).min(budget);
            let needed = table.blocks_needed(n);
            if !pool
                .borrow()
                .can_allocate(needed + total(&reserved), watermark)
            {
                break; // `table` drops here, releasing its prefix hits.
            }
            self.waiting.pop_front();
            reserved.push((id, needed));
            seq.num_computed_tokens = cached;
            seq.num_cached_tokens = cached;
            seq.table = Some(table);
            seq.status = SeqStatus::Running;
            self.running.push(id);
            plan.seqs.push(ScheduledSeq {
                seq_id: id,
                num_tokens: n,
            });
            budget -= n;
        }
        plan
    }

    /// Free a running sequence's blocks and send it back to the front of the queue; its full
    /// blocks were committed to the prefix cache as they filled, so recompute mostly hits.
    fn preempt(&mut self, id: SeqId, seqs: &mut HashMap<SeqId, Sequence>) {
        if let Some(seq) = seqs.get_mut(&id) {
            seq.table = None;
            seq.num_computed_tokens = 0;
            seq.status = SeqStatus::Waiting;
        }
        self.num_preemptions += 1;
        self.waiting.push_front(id);
    }
}
