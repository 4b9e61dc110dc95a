//! Constrained decoding: a per-sequence rule on which token may come next, applied as a logits
//! mask before sampling. The one kind is a grammar (`grammar.rs`: structured outputs, and a
//! forced tool call's arguments under the tool's schema).

pub trait TokenConstraint: Send {
    /// Masks `logits` in place to the tokens that may come next; returns how many may. When
    /// none may, the logits are left as they are (the caller ends the sequence).
    fn mask(&mut self, logits: &mut [f32]) -> usize;
    /// Record that `token` was sampled.
    fn advance(&mut self, token: u32);
    /// The constrained text is finished: the sequence stops here.
    fn is_complete(&self) -> bool;
}
