//! How many draft tokens a sequence proposes: the count that maximizes expected tokens per
//! unit of step time, from the acceptance this sequence has seen.
//!
//! With `r` the chance that a draft token is accepted given the ones before it were, a draft
//! of `d` tokens yields `1 + r + r² + … + r^d` tokens for `1 + c·d` of a decode step's time
//! (`c` = `SpecConfig::row_cost`). The policy picks the `d` with the best ratio, and none when
//! the best gains less than `MIN_GAIN`. `r` is estimated from decayed counts with an
//! optimistic prior. A sequence whose drafts stop paying stops proposing for a cooldown that
//! doubles with each failed probe (up to `MAX_COOLDOWN` steps) and resets when drafts pay
//! again: free text pays for a short probe now and then, while an agent that was writing prose
//! and starts repeating a tool result is caught within a few dozen steps.

/// The prior: `PRIOR_ACCEPTED` of `PRIOR_POSITIONS` draft positions accepted.
const PRIOR_ACCEPTED: f32 = 1.5;
const PRIOR_POSITIONS: f32 = 2.0;
/// Weight of the past at each verification.
const DECAY: f32 = 0.8;
/// A draft must promise this much more output per unit of time than plain decoding.
const MIN_GAIN: f32 = 1.05;
const FIRST_COOLDOWN: u32 = 8;
const MAX_COOLDOWN: u32 = 64;

/// One sequence's speculation record.
#[derive(Debug, Clone, Default)]
pub struct SpecState {
    /// Decayed draft positions verified and accepted.
    accepted: f32,
    positions: f32,
    /// Steps left before this sequence proposes again.
    cooldown: u32,
    /// The next cooldown's length (0: the first).
    next_cooldown: u32,
    /// Totals over the sequence's life (usage and tests).
    pub proposed_total: usize,
    pub accepted_total: usize,
}

impl SpecState {
    /// Estimated chance a draft token is accepted.
    pub fn acceptance(&self) -> f32 {
        (self.accepted + PRIOR_ACCEPTED) / (self.positions + PRIOR_POSITIONS)
    }

    /// The draft length worth proposing now, at most `max`.
    pub fn draft_len(&self, max: usize, row_cost: f32) -> usize {
        if self.cooldown > 0 {
            return 0;
        }
        best_len(self.acceptance(), max, row_cost)
    }

    /// A verification of `proposed` draft tokens accepted the first `accepted`.
    pub fn record(&mut self, proposed: usize, accepted: usize, max: usize, row_cost: f32) {
        // The positions the draws reached: every accepted one, and the one that failed.
        let reached = accepted + usize::from(accepted < proposed);
        self.accepted = self.accepted * DECAY + accepted as f32;
        self.positions = self.positions * DECAY + reached as f32;
        self.proposed_total += proposed;
        self.accepted_total += accepted;
        if best_len(self.acceptance(), max, row_cost) == 0 {
            // Stop; after the cooldown, probe from the prior again.
            self.cooldown = self.next_cooldown.max(FIRST_COOLDOWN);
            self.next_cooldown = (self.cooldown * 2).min(MAX_COOLDOWN);
            self.accepted = 0.0;
            self.positions = 0.0;
        } else if accepted > 0 {
            self.next_cooldown = 0;
        }
    }

    /// A decode step without a verification.
    pub fn idle(&mut self) {
        self.cooldown = self.cooldown.saturating_sub(1);
    }
}

fn best_len(r: f32, max: usize, row_cost: f32) -> usize {
    let (mut best, mut best_value) = (0, 0.0f32);
    let (mut tokens, mut power) = (1.0f32, 1.0f32);
    for d in 1..=max {
        power *= r;
        tokens += power;
        let value = tokens / (1.0 + row_cost * d as f32);
        if value > best_value {
            (best, best_value) = (d, value);
        }
    }
    if best_value < MIN_GAIN {
        0
    } else {
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_sequence_stops_and_probes_again_less_often() {
        let mut s = SpecState::default();
        let mut gaps = Vec::new();
        let mut since = 0;
        for _ in 0..400 {
            let d = s.draft_len(8, 0.45);
            if d == 0 {
                s.idle();
                since += 1;
            } else {
                s.record(d, 0, 8, 0.45);
                gaps.push(since);
                since = 0;
            }
        }
        let probes = gaps.len();
        assert!(probes < 20, "{probes} verifications in 400 steps: {gaps:?}");
        assert!(gaps.windows(2).all(|w| w[1] >= w[0]), "{gaps:?}");
        assert!(gaps.last().is_some_and(|&g| g >= 32), "{gaps:?}");
    }

    #[test]
    fn full_acceptance_grows_the_draft_to_the_most_allowed() {
        let mut s = SpecState::default();
        for _ in 0..10 {
            let d = s.draft_len(8, 0.45);
            s.record(d, d, 8, 0.45);
        }
        assert_eq!(s.draft_len(8, 0.45), 8);
        assert_eq!(best_len(s.acceptance(), 8, 2.0), 0, "rows too dear to pay");
    }
}
