//! Prompt lookup (vLLM's `ngram` proposer): find the last `n` tokens earlier in the context,
//! for `n` from `MAX_N` down to `MIN_N`, and propose what followed the most recent occurrence.
//! A linear scan per step: the context is at most the model's length, and the scan is a
//! compare per token.

/// Longest pattern tried first.
const MAX_N: usize = 4;
/// A single repeated token is too weak a signal to spend rows on.
const MIN_N: usize = 2;

pub(super) fn propose(context: &[u32], prediction: Option<&[u32]>, max: usize, out: &mut Vec<u32>) {
    let len = context.len();
    for n in (MIN_N..=MAX_N.min(len)).rev() {
        let pattern = &context[len - n..];
        // The context first (excluding the pattern's own place), then the prediction.
        if let Some(at) = last_occurrence(&context[..len - 1], pattern) {
            super::copy_continuation(context, at + n, true, max, out);
        } else if let Some(p) = prediction {
            if let Some(at) = last_occurrence(p, pattern) {
                super::copy_continuation(p, at + n, false, max, out);
            }
        }
        if !out.is_empty() {
            return;
        }
    }
}

/// The start of the last occurrence of `pattern` in `hay` that has at least one token after it.
fn last_occurrence(hay: &[u32], pattern: &[u32]) -> Option<usize> {
    let n = pattern.len();
    if hay.len() <= n {
        return None;
    }
    (0..hay.len() - n)
        .rev()
        .find(|&i| &hay[i..i + n] == pattern)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_pattern_wins_and_the_latest_occurrence() {
        // [3, 4] occurs twice; [2, 3, 4] once, followed by 9.
        let ctx = [2, 3, 4, 9, 0, 3, 4, 7, 0, 2, 3, 4];
        let mut out = Vec::new();
        propose(&ctx, None, 2, &mut out);
        assert_eq!(out, [9, 0]);
        let ctx = [1, 3, 4, 9, 0, 3, 4, 7, 0, 2, 3, 4];
        out.clear();
        propose(&ctx, None, 2, &mut out);
        assert_eq!(out, [7, 0]);
    }
}
