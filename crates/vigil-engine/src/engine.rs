//! The engine loop: `step()` = schedule → prepare + run → sample and postprocess. Owns the
//! sequences, the block pool, the scheduler and the model runner as plain data.
//!
//! A model with sliding-window layers gives back the local-layer KV of blocks no sequence,
//! fork or pin will read there again (`local_kv`); every path that reuses KV (prefix hits,
//! pin forks, shifts, restores) keeps to the part a query may still continue from.

use crate::block_table::{OutOfBlocks, SharedBlockPool};
use crate::model_runner::{ModelRunner, RowUse};
use crate::pins::{PinKey, PinKv, PinSave, PinStore, PinUse};
use crate::sampling::SamplingParams;
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::sequence::{FinishReason, Priority, SeqId, SeqStatus, Sequence, StopCriteria};
use crate::speculative::{self, DraftModel, DraftRequest, SpecConfig, SpecMethod, SpecStats};
use std::collections::{HashMap, HashSet};

/// One token produced for one sequence in a step.
#[derive(Debug, Clone)]
pub struct TokenOutput {
    pub seq_id: SeqId,
    pub token: u32,
    pub logprob: f32,
    pub top_logprobs: Vec<(u32, f32)>,
    pub finished: Option<FinishReason>,
}

/// What the last `step()` computed: prompt tokens (prefill, including recompute after
/// preemption) and generated-token inputs (decode).
#[derive(Debug, Clone, Copy, Default)]
pub struct StepStats {
    pub num_prefill_tokens: usize,
    pub num_decode_tokens: usize,
}

pub struct LlmEngine {
    pub runner: ModelRunner,
    pub pool: SharedBlockPool,
    pub scheduler: Scheduler,
    pub seqs: HashMap<SeqId, Sequence>,
    pub last_step: StepStats,
    /// Session KV held between requests.
    pub pins: PinStore,
    /// Speculative decoding: the server-wide settings and the counters since start.
    pub spec: SpecConfig,
    pub spec_stats: SpecStats,
    /// The draft model, when the server has one (`SpecMethod::Draft`).
    pub draft: Option<DraftModel>,
    next_id: SeqId,
    logits_row: Vec<f32>,
}

impl LlmEngine {
    pub fn new(runner: ModelRunner, config: SchedulerConfig) -> Self {
        let pool = SharedBlockPool::new(runner.kv.num_blocks, runner.kv.block_size);
        pool.set_local_window(runner.local_window());
        LlmEngine {
            runner,
            pool,
            scheduler: Scheduler::new(config),
            seqs: HashMap::new(),
            last_step: StepStats::default(),
            pins: PinStore::default(),
            spec: SpecConfig::default(),
            spec_stats: SpecStats::default(),
            draft: None,
            next_id: 1,
            logits_row: Vec::new(),
        }
    }

    /// Give back the local-layer KV of blocks slid past (the default for a model with
    /// sliding-window layers), or keep all of it. Only before any block is taken; whether it
    /// was set.
    pub fn set_local_kv_release(&mut self, on: bool) -> bool {
        let window = if on { self.runner.local_window() } else { None };
        self.pool.set_local_window(window)
    }

    /// Give back the pages of the blocks whose local-layer KV was released since last time.
    fn release_local_kv(&mut self) {
        let blocks = self.pool.take_local_released();
        let pool = self.pool.borrow();
        self.runner
            .release_local_kv(&blocks, |id| pool.is_local_released(id));
    }

    /// Queue a foreground request.
    pub fn add_request(
        &mut self,
        prompt: Vec<u32>,
        params: SamplingParams,
        stop: StopCriteria,
    ) -> SeqId {
        self.add_request_with_priority(prompt, params, stop, Priority::Foreground)
    }

    /// Queue a request in a scheduling class. Ids are issued in arrival order, which the
    /// scheduler uses as age.
    pub fn add_request_with_priority(
        &mut self,
        prompt: Vec<u32>,
        params: SamplingParams,
        stop: StopCriteria,
        priority: Priority,
    ) -> SeqId {
        self.add_sequence(prompt, params, stop, priority, None)
    }

    /// Queue a request, starting from a fork of `pin`'s KV when it shares a prefix with the
    /// prompt (those tokens count as cached and are not computed again).
    pub fn add_sequence(
        &mut self,
        prompt: Vec<u32>,
        params: SamplingParams,
        stop: StopCriteria,
        priority: Priority,
        pin: Option<PinUse>,
    ) -> SeqId {
        let id = self.next_id;
        self.next_id += 1;
        let mut seq = Sequence::new(id, prompt, params, stop);
        seq.priority = priority;
        if let Some(p) = pin {
            seq.table = self.pins.fork_for(p.key, &seq.token_ids);
            seq.pin = Some(p);
        }
        self.seqs.insert(id, seq);
        self.scheduler.add(id);
        id
    }

    /// Drop a sequence and free its blocks at once (saving its computed KV to its pin first
    /// when it asked for that).
    pub fn abort(&mut self, id: SeqId) {
        self.scheduler.remove(id);
        if let Some(mut seq) = self.seqs.remove(&id) {
            if seq.pin.is_some_and(|p| p.save_on_abort) {
                self.save_to_pin(&mut seq);
            }
        }
    }

    /// Cut tokens `keep .. keep + drop` out of pin `key` and move the tokens after them back
    /// `drop` positions, re-rotating their keys (the approximate position shift of a session
    /// window: no recompute, but the moved KV still saw the cut tokens). The new blocks stay
    /// out of the prefix cache. False, changing nothing, when the pin does not hold KV for all
    /// its tokens or the pool lacks the blocks: the caller then recomputes.
    pub fn shift_pin(&mut self, key: PinKey, keep: usize, drop: usize) -> bool {
        let Some(pin) = self.pins.get(key) else {
            return false;
        };
        let (Some(old), n) = (pin.table.as_ref(), pin.tokens.len()) else {
            return false;
        };
        if old.num_tokens() < n || keep + drop > n || drop == 0 {
            return false;
        }
        let tail = n - keep - drop;
        // The next query (at `keep + tail`) reads, in local layers, rows kept or moved from
        // the old table: none may come from a block whose local KV was released.
        let released = {
            let pool = self.pool.borrow();
            let bs = pool.block_size();
            let first = pool.local.first_needed_block(keep + tail) * bs;
            let source = |p: usize| if p < keep { p } else { p + drop };
            (first..keep + tail).any(|p| {
                let block = old.block_ids().get(source(p) / bs);
                block.is_none_or(|&b| pool.is_local_released(b))
            })
        };
        if released {
            return false;
        }
        let mut table = old.fork();
        table.truncate(keep);
        let Ok(appended) = table.append_slots(tail) else {
            return false;
        };
        if let Some(c) = appended.copy {
            self.runner
                .kv
                .copy_block(c.src_block, c.dst_block, c.num_tokens);
        }
        let moves: Vec<(usize, usize)> = (appended.slots.iter().enumerate())
            .filter_map(|(i, &dst)| old.slot(keep + drop + i).map(|src| (src, dst)))
            .collect();
        debug_assert_eq!(moves.len(), tail);
        let runner = &mut self.runner;
        runner
            .model
            .shift_kv(&mut runner.kv, &moves, -(drop as i64));
        table.stop_caching_from(keep);
        // Blocks before the next query's window may hold rows moved from released ones.
        table.slide(keep + tail, keep + tail);
        let mut tokens = pin.tokens[..keep].to_vec();
        tokens.extend_from_slice(&pin.tokens[keep + drop..]);
        self.pins.save(key, tokens, table);
        self.release_local_kv();
        true
    }

    /// A copy of the KV a pin holds: its tokens with KV and their rows (`KvCache::read_rows`).
    pub fn read_pin(&self, key: PinKey) -> Option<PinKv> {
        let pin = self.pins.get(key)?;
        let table = pin.table.as_ref()?;
        let n = table.num_tokens().min(pin.tokens.len());
        let slots: Option<Vec<usize>> = (0..n).map(|p| table.slot(p)).collect();
        let kv = &self.runner.kv;
        let pool = self.pool.borrow();
        let bs = pool.block_size();
        let last_released =
            (table.block_ids()[..n.div_ceil(bs)].iter()).rposition(|&b| pool.is_local_released(b));
        Some(PinKv {
            tokens: pin.tokens[..n].to_vec(),
            rows: kv.read_rows(&slots?),
            dtype: kv.dtype(),
            num_layers: kv.num_layers(),
            kv_dim: kv.kv_dim,
            local_from: last_released.map_or(0, |r| ((r + 1) * bs).min(n)),
        })
    }

    /// Make `kv` (read from a pin, perhaps by another process of the same model) the pin
    /// `key` holds, unless the pin already holds KV; whether it did. `cacheable`: the rows
    /// are what a prefill of the tokens computes (not position-shifted), so their full blocks
    /// may serve other requests from the prefix cache.
    pub fn write_pin(&mut self, key: PinKey, mut kv: PinKv, cacheable: bool) -> bool {
        let held = self.pins.get(key).is_some_and(|p| p.num_kv_tokens() > 0);
        let c = &self.runner.kv;
        let fits =
            kv.dtype == c.dtype() && kv.num_layers == c.num_layers() && kv.kv_dim == c.kv_dim;
        if held || !fits || kv.tokens.is_empty() {
            return false;
        }
        let mut table = self.pool.new_table(0);
        let Ok(appended) = table.append_slots(kv.tokens.len()) else {
            return false;
        };
        if !self.runner.kv.write_rows(&appended.slots, &kv.rows) {
            return false;
        }
        // Rows before `local_from` lack their local-layer KV: those blocks are released, and
        // the pin keeps no more than a query can continue from.
        let bs = self.pool.borrow().block_size();
        table.advance_horizon(kv.local_from.div_ceil(bs));
        let usable = table.usable_len(kv.tokens.len());
        if usable == 0 {
            drop(table);
            self.release_local_kv();
            return false;
        }
        table.truncate(usable);
        kv.tokens.truncate(usable);
        if cacheable {
            table.commit_full_blocks(&kv.tokens);
        } else {
            table.stop_caching_from(0);
        }
        self.pins.save(key, kv.tokens, table);
        self.release_local_kv();
        true
    }

    /// Replace the sequence's pin with its KV: the tokens its `PinSave` keeps, cut to what
    /// has KV.
    fn save_to_pin(&mut self, seq: &mut Sequence) {
        let (Some(pin), Some(mut table)) = (seq.pin, seq.table.take()) else {
            return;
        };
        let Some(save) = pin.save else {
            return;
        };
        let keep = match save {
            PinSave::Prompt => seq.num_prompt_tokens,
            PinSave::All => seq.token_ids.len(),
        };
        // A table can hold slots for tokens a step has not computed yet only inside `step`.
        let computed = seq.num_computed_tokens.min(table.num_tokens());
        table.truncate(computed.min(keep));
        let tokens = seq.token_ids[..keep].to_vec();
        self.pins.save(pin.key, tokens, table);
    }

    /// Memory pressure: idle sessions give back their KV first. When nothing can run at all,
    /// busy pins go too (their forks keep what they share), then the forks of waiting
    /// sequences (they recompute): the pins are a cache of the sessions' mirrors, never the
    /// data itself, so progress comes before keeping them.
    fn relieve_pressure(&mut self, stuck: bool) {
        let busy = self.busy_pins();
        if self.pins.evict_idle(&busy) || !stuck {
            return;
        }
        if self.pins.evict_idle(&HashSet::new()) {
            return;
        }
        for id in self.scheduler.waiting.clone() {
            if let Some(seq) = self.seqs.get_mut(&id) {
                if seq.table.take().is_some() {
                    seq.num_computed_tokens = 0;
                }
            }
        }
    }

    /// Pins that a live sequence was forked from or will save to: evicted last.
    fn busy_pins(&self) -> HashSet<u64> {
        (self.seqs.values())
            .filter_map(|s| s.pin.map(|p| p.key))
            .collect()
    }

    pub fn has_work(&self) -> bool {
        self.scheduler.has_work()
    }

    /// Sequences queued without blocks (new or preempted).
    pub fn num_waiting(&self) -> usize {
        self.scheduler.num_waiting()
    }

    /// Sequences holding blocks.
    pub fn num_running(&self) -> usize {
        self.scheduler.num_running()
    }

    /// Remove a finished sequence, returning it (its blocks are freed when it drops).
    pub fn take_finished(&mut self, id: SeqId) -> Option<Sequence> {
        if self.seqs.get(&id).is_some_and(|s| s.is_finished()) {
            return self.seqs.remove(&id);
        }
        None
    }

    /// One step: schedule → run → sample and postprocess. Errs only if the scheduler admitted
    /// more than the block pool holds, a bug reported instead of a panic.
    pub fn step(&mut self) -> Result<Vec<TokenOutput>, OutOfBlocks> {
        self.propose_drafts();
        let plan = self.scheduler.schedule(&mut self.seqs, &self.pool);
        self.last_step = StepStats::default();
        let stuck = plan.seqs.is_empty() && self.scheduler.num_waiting() > 0;
        if stuck || !plan.preempted.is_empty() {
            self.relieve_pressure(stuck);
        }
        if plan.seqs.is_empty() {
            return Ok(Vec::new());
        }
        for s in &plan.seqs {
            if let Some(seq) = self.seqs.get(&s.seq_id) {
                let prompt_left = seq
                    .num_prompt_tokens
                    .saturating_sub(seq.num_computed_tokens)
                    .min(s.num_tokens);
                self.last_step.num_prefill_tokens += prompt_left;
                self.last_step.num_decode_tokens += s.num_tokens - prompt_left;
            }
        }
        let sampling = self.runner.prepare(&plan, &mut self.seqs)?;
        self.release_local_kv();
        let drafted: Vec<SeqId> = (sampling.iter())
            .filter(|(_, u)| *u == RowUse::Draft(0))
            .map(|&(id, _)| id)
            .collect();
        let step = self.runner.run(sampling);
        let vocab = step.vocab_size;
        let mut outputs = Vec::with_capacity(step.seq_ids.len());
        for (row, &(id, row_use)) in step.seq_ids.iter().enumerate() {
            let Some(seq) = self.seqs.get_mut(&id) else {
                continue;
            };
            self.logits_row.clear();
            self.logits_row
                .extend_from_slice(&step.logits[row * vocab..(row + 1) * vocab]);
            if row_use == RowUse::ScorePrompt {
                seq.score_prompt_row(&mut self.logits_row);
                continue;
            }
            if seq.is_finished() || seq.draft_rejected {
                // A row past where the verification ended.
                continue;
            }
            let out = seq.sample_and_append(&mut self.logits_row);
            let finished = seq.check_stop();
            if let RowUse::Draft(i) = row_use {
                if seq.draft.get(i) == Some(&out.token) {
                    seq.draft_accepted += 1;
                } else {
                    seq.draft_rejected = true;
                }
            }
            if let Some(reason) = finished {
                seq.status = SeqStatus::Finished(reason);
                self.scheduler.remove(id);
            }
            outputs.push(TokenOutput {
                seq_id: id,
                token: out.token,
                logprob: out.logprob,
                top_logprobs: out.top_logprobs,
                finished,
            });
        }
        for id in drafted {
            self.settle_draft(id);
        }
        for out in &outputs {
            if out.finished.is_some() {
                if let Some(mut seq) = self.seqs.remove(&out.seq_id) {
                    self.save_to_pin(&mut seq);
                    seq.table = None;
                    self.seqs.insert(out.seq_id, seq);
                }
            }
        }
        Ok(outputs)
    }

    /// Give each running sequence that is about to decode a draft to verify in this step
    /// (`speculative`), as long as its policy says drafts pay. Never past `max_tokens`: the
    /// token after the draft counts too.
    fn propose_drafts(&mut self) {
        let config = &self.spec;
        let mut for_draft_model = Vec::new();
        for id in &self.scheduler.running {
            let Some(seq) = self.seqs.get_mut(id) else {
                continue;
            };
            seq.draft.clear();
            let request = &seq.params.speculative;
            let method = request.method.unwrap_or(config.method);
            let decoding = seq.num_computed_tokens + 1 == seq.num_tokens();
            if method == SpecMethod::Off || !decoding || seq.is_finished() {
                continue;
            }
            let room = (seq.stop.max_tokens).saturating_sub(seq.num_output_tokens() + 1);
            let max = config.max_draft.min(room);
            let len = seq.spec.draft_len(max, config.row_cost);
            if len == 0 {
                seq.spec.idle();
                continue;
            }
            if method == SpecMethod::Draft {
                for_draft_model.push((*id, len));
                continue;
            }
            let prediction = request.prediction.as_deref();
            let output = seq.num_output_tokens();
            let context = &seq.token_ids;
            speculative::propose(method, context, output, prediction, len, &mut seq.draft);
        }
        if let Some(draft) = self.draft.as_mut() {
            let running = &self.scheduler.running;
            draft.retain(|id| running.contains(&id));
            let requests: Vec<DraftRequest> = (for_draft_model.iter())
                .filter_map(|&(seq_id, len)| {
                    let context = &self.seqs.get(&seq_id)?.token_ids;
                    Some(DraftRequest {
                        seq_id,
                        context,
                        len,
                    })
                })
                .collect();
            let drafts = draft.propose(&requests);
            let ids: Vec<SeqId> = requests.iter().map(|r| r.seq_id).collect();
            for (id, tokens) in ids.into_iter().zip(drafts) {
                if let Some(seq) = self.seqs.get_mut(&id) {
                    seq.draft = tokens;
                }
            }
        }
    }

    /// After a verification: the KV of draft rows past the confirmed ones is dropped (the
    /// sequence's last token, sampled this step, has none yet), confirmed full blocks enter the
    /// prefix cache, and the policy and counters learn the outcome.
    fn settle_draft(&mut self, id: SeqId) {
        let Some(seq) = self.seqs.get_mut(&id) else {
            return;
        };
        let proposed = seq.draft.len();
        let accepted = seq.draft_accepted;
        let config = &self.spec;
        seq.spec
            .record(proposed, accepted, config.max_draft, config.row_cost);
        self.spec_stats.drafts += 1;
        self.spec_stats.proposed_tokens += proposed as u64;
        self.spec_stats.accepted_tokens += accepted as u64;
        seq.draft.clear();
        seq.draft_accepted = 0;
        seq.draft_rejected = false;
        let computed = seq.num_tokens() - 1;
        seq.num_computed_tokens = computed;
        if let Some(table) = seq.table.as_mut() {
            table.truncate(computed);
            table.commit_full_blocks(&seq.token_ids[..computed]);
        }
    }

    /// Check the block-accounting invariant against every live table.
    pub fn check_invariants(&self) -> Result<(), String> {
        let tables: Vec<_> = (self.seqs.values())
            .filter_map(|s| s.table.as_ref())
            .chain(self.pins.tables())
            .collect();
        self.pool.check_invariants(&tables)
    }
}
