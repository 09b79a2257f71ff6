//! Prompt-lookup drafting: the continuation of the most recent earlier
//! occurrence of the context's last few tokens, in the prompt or the output
//! so far. Input-grounded tasks (editing, summarizing, code rewrites) copy
//! long runs of the prompt, which this finds for free.

/// Longest suffix tried, and the default shortest (longest first).
pub(crate) const MAX_MATCH: usize = 4;
pub(crate) const MIN_MATCH: usize = 2;

/// Up to `gamma` tokens following the most recent earlier occurrence of the
/// last `n` tokens of `history`, for the largest `n` in `min..=MAX_MATCH`
/// that occurs; empty when none does. A scan of the history: microseconds
/// against a forward pass of milliseconds.
pub(crate) fn propose(history: &[i32], gamma: usize, min: usize) -> Vec<i32> {
    let len = history.len();
    if gamma == 0 {
        return vec![];
    }
    for n in (min.max(1)..=MAX_MATCH.min(len.saturating_sub(1))).rev() {
        let tail = &history[len - n..];
        // Occurrences ending before the end, the most recent first.
        for end in (n..len).rev() {
            if &history[end - n..end] == tail {
                return history[end..len.min(end + gamma)].to_vec();
            }
        }
    }
    vec![]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continues_the_longest_most_recent_match() {
        // "1 2 3" occurs at the start and is the current suffix: propose what followed.
        assert_eq!(propose(&[1, 2, 3, 4, 5, 6, 9, 1, 2, 3], 3, MIN_MATCH), vec![4, 5, 6]);
        assert_eq!(propose(&[1, 2, 3, 4, 5, 6, 9, 1, 2, 3], 10, MIN_MATCH), vec![4, 5, 6, 9, 1, 2, 3]);
        // A 4-gram match wins over a more recent 2-gram one.
        assert_eq!(propose(&[7, 8, 1, 2, 5, 0, 1, 2, 6, 7, 8, 1, 2], 1, MIN_MATCH), vec![5]);
        // The most recent of equal-length matches.
        assert_eq!(propose(&[1, 2, 5, 1, 2, 6, 1, 2], 1, MIN_MATCH), vec![6]);
        assert!(propose(&[1, 2, 3, 4], 5, MIN_MATCH).is_empty(), "no earlier occurrence");
        assert!(propose(&[1, 1], 5, MIN_MATCH).is_empty(), "too short");
        assert!(propose(&[1, 2, 1, 2], 0, MIN_MATCH).is_empty());
        assert_eq!(propose(&[4, 9, 3, 4], 2, 1), vec![9, 3], "single-token matches when asked");
    }
}
