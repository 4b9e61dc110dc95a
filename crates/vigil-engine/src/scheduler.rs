//! Picks what runs in the next step. vLLM v1's rule (a token budget per step; sequences that
//! hold blocks first, their next token or next prefill chunk; then waiting ones admitted while
//! blocks last above a watermark) applied per priority class, highest first: running
//! `Foreground`, waiting `Foreground`, then `Ingest`, then `Background`. A lower class only gets
//! the budget and blocks left over, and a waiting sequence may preempt running ones of a lower
//! class to get in.
//!
//! Out of blocks → preempt the running sequence of the lowest class, newest first, by
//! recompute: its full blocks stay in the prefix cache, so readmission is mostly hits.
//!
//! While a Foreground sequence is in the step, the lower classes share at most
//! `max_lower_tokens_with_foreground` tokens of it, so background prefill does not stretch
//! interactive steps. That share is also theirs for certain: while session work (ingest, a
//! flash evaluation) is queued or running, Foreground plans from a budget short of it, so no
//! foreground load, however heavy, stops the data plane. The share grows to what finishes each
//! session sequence's prefill within `session_deadline_steps` steps of its arrival (up to half
//! a step): under a saturated engine an ingest batch still lands in a bounded number of steps,
//! and client requests give up only what the data plane needs. While session work is due the
//! whole step may also be held to `session_step_budget` tokens, so the step a batch waits for
//! and the step it lands in are short. While any running sequence decodes, the step is held to
//! `decode_step_budget` tokens, so a decode token never waits for more prefill than that.
//!
//! Session work has seats of its own: `Foreground` sequences take at most `max_seqs` seats,
//! and the lower classes may use `session_seats` more, so a server full of chat streams still
//! admits a session's ingest batch or flash evaluation in the next step instead of after the
//! age bound (its tokens then come out of the share above).
//!
//! Age is arrival order, which is id order (the engine issues ids in arrival order). A
//! sequence below `Foreground` that waits more than `promote_after_steps` steps is promoted to
//! `Foreground` for the rest of its life, so no class starves.

use crate::block_table::SharedBlockPool;
use crate::sequence::{Priority, SeqId, SeqStatus, Sequence};
use std::cmp::Reverse;
use std::collections::{HashMap, VecDeque};

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Tokens computed per step across all sequences.
    pub max_batched_tokens: usize,
    pub max_seqs: usize,
    /// Fraction of blocks kept free when admitting new sequences.
    pub watermark: f32,
    pub enable_prefix_cache: bool,
    /// Steps a sequence below `Foreground` may wait before it is scheduled as `Foreground`.
    pub promote_after_steps: u64,
    /// While a `Foreground` sequence is in the step, the lower classes get at most this many
    /// tokens of it: a session's ingest or flash work must not turn every token of an
    /// interactive request into a long prefill step. While session work is due it also gets
    /// this many for certain (capped at `session_chunk_tokens` and half a step): Foreground
    /// plans from the rest.
    pub max_lower_tokens_with_foreground: usize,
    /// Steps within which session work should finish its prefill beside client requests: the
    /// session share grows to what that takes, up to half of `max_batched_tokens`; 0 keeps it
    /// at the base.
    pub session_deadline_steps: u64,
    /// The same deadline in milliseconds, when set (not 0): the engine thread turns it into
    /// `session_deadline_steps` after every step from the recent step times, so the bound
    /// holds in time whether a step takes 20 ms or 2 s.
    pub session_deadline_ms: u64,
    /// Seats beyond `max_seqs` that only sequences below `Foreground` (session ingest, flash
    /// evaluations, warm) may take.
    pub session_seats: usize,
    /// Most tokens the classes below `Flash` (ingest, warm) compute in one step, whatever
    /// else runs: a step cannot be interrupted, so a flash evaluation or a client request that
    /// arrives during a window recompute waits at most one such chunk.
    pub session_chunk_tokens: usize,
    /// Tokens of a whole step while session work (ingest, a flash evaluation) is queued or
    /// running, when fewer than `max_batched_tokens`: a batch waits for the step in flight
    /// and then lands in its own, so shorter steps shorten push-to-resident under a full
    /// engine. Client requests lose little throughput (a step's weights are read once
    /// either way; prefill chunks are still hundreds of tokens).
    pub session_step_budget: usize,
    /// Tokens of a whole step while a running sequence decodes, when fewer than
    /// `max_batched_tokens`: every decoding sequence's next token waits for the step's prefill
    /// chunks, so shorter steps keep inter-token latency down under load, while a prompt with
    /// nothing decoding beside it still prefills in whole steps (Sarathi-Serve's chunk bound).
    pub decode_step_budget: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_batched_tokens: 512,
            max_seqs: 64,
            watermark: 0.01,
            enable_prefix_cache: true,
            promote_after_steps: 256,
            max_lower_tokens_with_foreground: 64,
            session_deadline_steps: 4,
            session_deadline_ms: 0,
            session_seats: 2,
            session_chunk_tokens: 128,
            session_step_budget: usize::MAX,
            decode_step_budget: usize::MAX,
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
    /// Sequences without blocks; `schedule` sorts them by class, then age.
    pub waiting: VecDeque<SeqId>,
    /// Sequences holding blocks; `schedule` sorts them by class, then age.
    pub running: Vec<SeqId>,
    pub num_preemptions: u64,
    /// Sequences promoted to `Foreground` by the age bound.
    pub num_promotions: u64,
    num_steps: u64,
    /// The step count when each waiting sequence (re)entered the queue.
    waiting_since: HashMap<SeqId, u64>,
    /// The step count when each sequence arrived (for the session share's deadline).
    arrived: HashMap<SeqId, u64>,
}

/// What one `schedule` call has handed out so far.
struct StepState {
    plan: StepPlan,
    budget: usize,
    /// Blocks the plan will take when the runner appends; the pool only hands them out then.
    reserved: Vec<(SeqId, usize)>,
    /// The highest class preempted this step: nothing at or below it is admitted, so a victim
    /// is not readmitted in the step that evicted it.
    victim_floor: Option<Priority>,
    /// A waiting sequence did not fit: admit nothing behind it.
    admission_closed: bool,
}

impl StepState {
    fn reserved_blocks(&self) -> usize {
        self.reserved.iter().map(|&(_, n)| n).sum()
    }

    fn push(&mut self, seq_id: SeqId, num_tokens: usize, blocks: usize) {
        self.reserved.push((seq_id, blocks));
        self.plan.seqs.push(ScheduledSeq { seq_id, num_tokens });
        self.budget -= num_tokens;
    }
}

fn class(seqs: &HashMap<SeqId, Sequence>, id: SeqId) -> Priority {
    seqs.get(&id)
        .map_or(Priority::Background, Sequence::effective_priority)
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Self {
        Scheduler {
            config,
            waiting: VecDeque::new(),
            running: Vec::new(),
            num_preemptions: 0,
            num_promotions: 0,
            num_steps: 0,
            waiting_since: HashMap::new(),
            arrived: HashMap::new(),
        }
    }

    pub fn add(&mut self, id: SeqId) {
        self.waiting.push_back(id);
        self.waiting_since.insert(id, self.num_steps);
        self.arrived.insert(id, self.num_steps);
    }

    pub fn remove(&mut self, id: SeqId) {
        self.waiting.retain(|&s| s != id);
        self.running.retain(|&s| s != id);
        self.waiting_since.remove(&id);
        self.arrived.remove(&id);
    }

    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn schedule(
        &mut self,
        seqs: &mut HashMap<SeqId, Sequence>,
        pool: &SharedBlockPool,
    ) -> StepPlan {
        self.num_steps += 1;
        self.waiting.retain(|id| seqs.contains_key(id));
        self.running.retain(|id| seqs.contains_key(id));
        self.waiting_since.retain(|id, _| seqs.contains_key(id));
        self.arrived.retain(|id, _| seqs.contains_key(id));
        self.promote_starved(seqs);
        let order = |&id: &SeqId| (Reverse(class(seqs, id)), id);
        self.waiting.make_contiguous().sort_by_key(order);
        self.running.sort_by_key(order);

        let step = self.step_tokens(seqs);
        let share = self.session_share(seqs, step);
        let mut st = StepState {
            plan: StepPlan::default(),
            budget: step - share,
            reserved: Vec::new(),
            victim_floor: None,
            admission_closed: false,
        };
        for class in Priority::DESCENDING {
            if class == Priority::Flash {
                // Foreground is planned: the session share goes back to the classes below.
                st.budget += share;
            }
            if class < Priority::Foreground && !st.plan.seqs.is_empty() {
                // Something of a higher class is planned (the classes run highest first).
                let most = self.config.max_lower_tokens_with_foreground.max(share);
                st.budget = st.budget.min(most);
            }
            if class < Priority::Flash {
                // A grown share may pass the chunk: the step is a saturated engine's anyway.
                st.budget = st.budget.min(self.config.session_chunk_tokens.max(share));
            }
            let planned =
                |c: Priority| (st.plan.seqs.iter()).any(|s| self::class(seqs, s.seq_id) == c);
            if class < Priority::Flash && planned(Priority::Flash) && !planned(Priority::Foreground)
            {
                // A flash evaluation runs without the data plane's prefill beside it. Not
                // beside client requests: there the evaluation decodes at their pace, and the
                // data plane keeps the rest of its share.
                st.budget = 0;
            }
            self.schedule_running(class, &mut st, seqs, pool);
            self.admit_waiting(class, &mut st, seqs, pool);
        }
        st.plan
    }

    /// The tokens kept out of Foreground's budget this step: the lower classes' share while
    /// session work (Flash or Ingest, not warm turns) is queued or running. The base share
    /// (`max_lower_tokens_with_foreground`, at most a chunk), or what finishes every such
    /// sequence's tokens by its deadline (`session_deadline_steps` after it arrived, spread
    /// evenly over the steps left) when that is more, up to half a step and to what the
    /// session work has left to compute.
    fn session_share(&self, seqs: &HashMap<SeqId, Sequence>, step: usize) -> usize {
        let half = step / 2;
        let base = (self.config.max_lower_tokens_with_foreground)
            .min(self.config.session_chunk_tokens)
            .min(half);
        let mut needed = 0usize;
        let mut remaining_all = 0usize;
        let mut overdue = false;
        for id in self.waiting.iter().chain(self.running.iter()) {
            let Some(seq) = seqs.get(id) else { continue };
            if !matches!(seq.effective_priority(), Priority::Flash | Priority::Ingest) {
                continue;
            }
            let remaining = seq.num_tokens() - seq.num_computed_tokens;
            remaining_all += remaining;
            let deadline = self.config.session_deadline_steps;
            if deadline == 0 {
                continue;
            }
            let age = self.num_steps - self.arrived.get(id).copied().unwrap_or(self.num_steps);
            // This step is step `age` of its life (the first is 1).
            let steps_left = (deadline + 1).saturating_sub(age.max(1)).max(1);
            overdue |= age > deadline;
            needed += remaining.div_ceil(steps_left as usize);
        }
        // Past its deadline, session work may take every token but one per running client
        // request (their decodes go on; new arrivals' prefill waits): a data plane that fell
        // behind catches up even when client prefill fills every step.
        let most = if overdue {
            let clients = (self.running.iter())
                .filter(|&&id| class(seqs, id) == Priority::Foreground)
                .count();
            half.max(step.saturating_sub(clients))
        } else {
            half
        };
        // None without session work, and never more than the session work can use: a flash
        // evaluation decoding alone takes a token a step, and client requests keep the rest.
        base.max(needed).min(most).min(remaining_all)
    }

    /// The step's token budget: `max_batched_tokens`, held to `session_step_budget` while
    /// session work is queued or running and to `decode_step_budget` (never below a token per
    /// running sequence) while a running sequence decodes.
    fn step_tokens(&self, seqs: &HashMap<SeqId, Sequence>) -> usize {
        let mut step = self.config.max_batched_tokens;
        let session_work = (self.waiting.iter().chain(self.running.iter()))
            .filter_map(|id| seqs.get(id))
            .any(|s| matches!(s.effective_priority(), Priority::Flash | Priority::Ingest));
        if session_work {
            step = step.min(self.config.session_step_budget.max(1));
        }
        // A sequence whose prompt is computed has one token left: its next sampled one.
        let decoding = (self.running.iter())
            .filter_map(|id| seqs.get(id))
            .any(|s| s.num_tokens() - s.num_computed_tokens <= 1);
        if decoding {
            step = step.min(self.config.decode_step_budget.max(self.running.len()));
        }
        step
    }

    /// Promote every waiting sequence that waited past the age bound.
    fn promote_starved(&mut self, seqs: &mut HashMap<SeqId, Sequence>) {
        for id in &self.waiting {
            let Some(seq) = seqs.get_mut(id) else {
                continue;
            };
            let since = self
                .waiting_since
                .get(id)
                .copied()
                .unwrap_or(self.num_steps);
            // Steps this sequence sat through unadmitted, not counting the current one.
            let waited = (self.num_steps - 1).saturating_sub(since);
            if seq.effective_priority() < Priority::Foreground
                && waited > self.config.promote_after_steps
            {
                seq.promoted = true;
                self.num_promotions += 1;
            }
        }
    }

    /// Schedule the running sequences of `class`, oldest first, preempting when blocks run out.
    fn schedule_running(
        &mut self,
        class_: Priority,
        st: &mut StepState,
        seqs: &mut HashMap<SeqId, Sequence>,
        pool: &SharedBlockPool,
    ) {
        let ids: Vec<SeqId> = (self.running.iter().copied())
            .filter(|&id| class(seqs, id) == class_)
            .collect();
        for id in ids {
            if st.budget == 0 {
                return;
            }
            let Some(seq) = seqs.get(&id) else {
                continue;
            };
            // A newer sequence of this class may have been preempted for an older one.
            if !self.running.contains(&id) {
                continue;
            }
            let mut n = seq.num_uncomputed_tokens().min(st.budget);
            if n == 0 {
                continue;
            }
            let mut needed = seq.table.as_ref().map_or(0, |t| t.blocks_needed(n));
            loop {
                if needed + st.reserved_blocks() <= pool.borrow().num_free_blocks() {
                    st.push(id, n, needed);
                    break;
                }
                // A speculative draft is dropped before anyone is preempted for its blocks.
                if let Some(seq) = seqs.get_mut(&id).filter(|s| !s.draft.is_empty()) {
                    seq.draft.clear();
                    n = seq.num_uncomputed_tokens().min(st.budget);
                    needed = seq.table.as_ref().map_or(0, |t| t.blocks_needed(n));
                    continue;
                }
                // `id` itself is running, so there always is a victim; it may be `id`.
                let Some(victim) = self.lowest_running(seqs) else {
                    break;
                };
                self.preempt(victim, st, seqs);
                if victim == id {
                    break;
                }
            }
        }
    }

    /// Admit waiting sequences of `class`, oldest first, while budget, blocks and seats last,
    /// preempting running sequences of lower classes to make room.
    fn admit_waiting(
        &mut self,
        class_: Priority,
        st: &mut StepState,
        seqs: &mut HashMap<SeqId, Sequence>,
        pool: &SharedBlockPool,
    ) {
        if st.admission_closed || st.victim_floor.is_some_and(|f| class_ <= f) {
            return;
        }
        let watermark = pool.borrow().watermark_blocks(self.config.watermark);
        let ids: Vec<SeqId> = (self.waiting.iter().copied())
            .filter(|&id| class(seqs, id) == class_)
            .collect();
        for id in ids {
            if st.budget == 0 {
                return;
            }
            let Some(seq) = seqs.get_mut(&id) else {
                continue;
            };
            // A sequence forked from a session pin arrives with its table; it waits holding
            // only shared blocks, so it must get the table back if it is not admitted now.
            let seeded = seq.table.take();
            // A preempted sequence looks up its output too: recompute then is mostly hits.
            // Scored prompt rows must be computed: a hit never covers the first of them.
            let lookup = match seq.params.score_prompt_from {
                Some(from) => &seq.token_ids[..(from + 1).min(seq.token_ids.len())],
                None => &seq.token_ids[..],
            };
            let hits = (self.config.enable_prefix_cache).then(|| pool.table_with_prefix(lookup, 0));
            // Another session or request may have cached more of the prompt than the pin
            // holds (a conversation warmed elsewhere): take whichever covers more, and keep
            // the seeded table to give back if the sequence is not admitted (the lookup took
            // blocks off the free list that earlier admissions this step counted on).
            let (table, table_is_seeded, spare) = match (seeded, hits) {
                (Some(t), Some(h)) if h.num_tokens() > t.num_tokens() => (h, false, Some(t)),
                (Some(t), _) => (t, true, None),
                (None, Some(h)) => (h, false, None),
                (None, None) => (pool.new_table(0), false, None),
            };
            let cached = table.num_tokens();
            let n = (seq.num_tokens() - cached).min(st.budget);
            let new_blocks = table.blocks_needed(n);
            let blocks = |st: &StepState| new_blocks + st.reserved_blocks() + watermark;
            if !self.fits(class_, blocks(st), seqs, pool) {
                let mut admitted = self.room_below(class_, blocks(st), seqs, pool);
                while admitted && !self.fits(class_, blocks(st), seqs, pool) {
                    match self.lowest_running(seqs) {
                        Some(victim) if class(seqs, victim) < class_ => {
                            self.preempt(victim, st, seqs)
                        }
                        _ => admitted = false,
                    }
                }
                if !admitted {
                    // Out of blocks, or of seats everyone shares: admit nothing behind it. A
                    // Foreground sequence that only lacks a Foreground seat leaves the session
                    // seats to the classes below.
                    let foreground_seats_full = class_ == Priority::Foreground
                        && self.running_foreground(seqs) >= self.config.max_seqs
                        && self.running.len() < self.config.max_seqs + self.config.session_seats
                        && self.fits(Priority::Ingest, blocks(st), seqs, pool);
                    st.admission_closed = !foreground_seats_full;
                    if let Some(seq) = seqs.get_mut(&id) {
                        seq.table = spare.or(table_is_seeded.then_some(table));
                    }
                    return; // A lookup's table drops here, releasing its prefix hits.
                }
            }
            let Some(seq) = seqs.get_mut(&id) else {
                continue;
            };
            self.waiting.retain(|&s| s != id);
            self.waiting_since.remove(&id);
            seq.num_computed_tokens = cached;
            if seq.num_preemptions == 0 {
                seq.num_cached_tokens = cached.min(seq.num_prompt_tokens);
            }
            seq.table = Some(table);
            seq.status = SeqStatus::Running;
            self.running.push(id);
            st.push(id, n, new_blocks);
        }
    }

    /// A seat for a sequence of `class_` among `running` (`foreground` of them Foreground):
    /// Foreground gets `max_seqs` seats, the lower classes `session_seats` more.
    fn seat_free(&self, class_: Priority, running: usize, foreground: usize) -> bool {
        let all = self.config.max_seqs + self.config.session_seats;
        match class_ {
            Priority::Foreground => foreground < self.config.max_seqs && running < all,
            _ => running < all,
        }
    }

    fn running_foreground(&self, seqs: &HashMap<SeqId, Sequence>) -> usize {
        (self.running.iter())
            .filter(|&&id| class(seqs, id) == Priority::Foreground)
            .count()
    }

    /// A seat for `class_` and `blocks` free blocks (reservations and watermark included)
    /// are there now.
    fn fits(
        &self,
        class_: Priority,
        blocks: usize,
        seqs: &HashMap<SeqId, Sequence>,
        pool: &SharedBlockPool,
    ) -> bool {
        self.seat_free(class_, self.running.len(), self.running_foreground(seqs))
            && pool.borrow().num_free_blocks() >= blocks
    }

    /// Whether preempting every running sequence below `class` would leave a seat and
    /// `blocks` free blocks. Counts only blocks a victim holds alone, so it may say no when
    /// victims share blocks; never yes when preempting them would not be enough.
    fn room_below(
        &self,
        class_: Priority,
        blocks: usize,
        seqs: &HashMap<SeqId, Sequence>,
        pool: &SharedBlockPool,
    ) -> bool {
        let victims: Vec<&Sequence> = (self.running.iter())
            .filter(|&&id| class(seqs, id) < class_)
            .filter_map(|id| seqs.get(id))
            .collect();
        let p = pool.borrow();
        let freed: usize = (victims.iter())
            .filter_map(|s| s.table.as_ref())
            .map(|t| {
                let ids = t.block_ids();
                ids.iter().filter(|&&b| p.ref_count(b) == 1).count()
            })
            .sum();
        let left = self.running.len() - victims.len();
        // Every victim is below `class_`, so no Foreground sequence is among them.
        self.seat_free(class_, left, self.running_foreground(seqs))
            && p.num_free_blocks() + freed >= blocks
    }

    /// The running sequence to preempt first: lowest class, then newest.
    fn lowest_running(&self, seqs: &HashMap<SeqId, Sequence>) -> Option<SeqId> {
        (self.running.iter().copied()).max_by_key(|&id| (Reverse(class(seqs, id)), id))
    }

    /// Free a running sequence's blocks and send it back to the queue, dropping it from this
    /// step's plan. Its full blocks are already in the prefix cache (the runner commits every
    /// block that fills, in the step that fills it), so they outlive the table as evictable
    /// cached blocks and readmission, which looks up prompt and output, mostly hits.
    fn preempt(&mut self, id: SeqId, st: &mut StepState, seqs: &mut HashMap<SeqId, Sequence>) {
        if let Some(pos) = st.plan.seqs.iter().position(|s| s.seq_id == id) {
            st.budget += st.plan.seqs.remove(pos).num_tokens;
        }
        st.reserved.retain(|&(s, _)| s != id);
        st.victim_floor = st.victim_floor.max(Some(class(seqs, id)));
        st.plan.preempted.push(id);
        self.running.retain(|&s| s != id);
        if let Some(seq) = seqs.get_mut(&id) {
            seq.table = None;
            seq.draft.clear();
            seq.num_computed_tokens = 0;
            seq.num_preemptions += 1;
            seq.status = SeqStatus::Waiting;
        }
        self.num_preemptions += 1;
        self.waiting.push_back(id);
        self.waiting_since.insert(id, self.num_steps);
    }
}
