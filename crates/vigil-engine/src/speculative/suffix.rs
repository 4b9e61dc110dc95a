//! Suffix matching: the longest earlier match of the context's suffix (up to `MAX_MATCH`
//! tokens), in the context or in the request's prediction, proposes what followed it. A match
//! of `l` tokens proposes at most `2 l` (suffix decoding's rule: a longer agreement is better
//! evidence), so a chance two-token match costs few rows. Ties go to the most recent
//! occurrence: agent loops and live streams repeat their latest shape.
//!
//! A linear scan per step over the positions holding the last token.

/// Matches are not extended past this many tokens.
const MAX_MATCH: usize = 32;
/// Shorter matches propose nothing.
const MIN_MATCH: usize = 2;

pub(super) fn propose(context: &[u32], prediction: Option<&[u32]>, max: usize, out: &mut Vec<u32>) {
    let Some(&last) = context.last() else {
        return;
    };
    // (match length, source, end of the match in the source, the source is the context)
    let mut best: Option<(usize, &[u32], usize, bool)> = None;
    let sources = [(prediction.unwrap_or_default(), false), (context, true)];
    for (src, is_context) in sources {
        // In the context, not the last position itself (it matches trivially).
        let end = src.len() - usize::from(is_context && !src.is_empty());
        for i in 0..end {
            if src[i] != last || i + 1 >= src.len() {
                continue;
            }
            let l = match_len(&src[..=i], context);
            if l >= MIN_MATCH && best.is_none_or(|(bl, ..)| l >= bl) {
                best = Some((l, src, i + 1, is_context));
            }
        }
    }
    if let Some((l, src, at, is_context)) = best {
        super::copy_continuation(src, at, is_context, max.min(2 * l), out);
    }
}

/// How many tokens `a` and `b` agree on, counting back from their ends (at most `MAX_MATCH`).
fn match_len(a: &[u32], b: &[u32]) -> usize {
    (a.iter().rev())
        .zip(b.iter().rev())
        .take(MAX_MATCH)
        .take_while(|(x, y)| x == y)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_match_wins_over_a_later_shorter_one() {
        // The suffix [1, 2, 3] matches 3 long at the start (then 8) and 2 long later (then 9).
        let ctx = [1, 2, 3, 8, 8, 8, 0, 2, 3, 9, 5, 1, 2, 3];
        let mut out = Vec::new();
        propose(&ctx, None, 8, &mut out);
        assert_eq!(out, [8, 8, 8, 0, 2, 3]);
    }

    #[test]
    fn a_short_match_proposes_little() {
        let ctx = [7, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3];
        let mut out = Vec::new();
        propose(&ctx, None, 8, &mut out);
        assert_eq!(out, [4, 5, 6, 7]);
    }
}
