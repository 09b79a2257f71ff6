//! Which drafted tokens a verify forward accepts. Pure functions over the
//! target's choices or distributions, so the rules are tested on their own.
//!
//! Greedy: the longest prefix of the drafts the target's argmax agrees with,
//! then the target's own token. Sampled: the standard speculative-sampling
//! rule (Leviathan et al., Chen et al.) with a one-hot draft distribution
//! (prompt lookup proposes one token per position with certainty): accept
//! draft `d` with probability `p(d)`; on a rejection draw from `p` without
//! `d`, renormalized; after a full acceptance draw the bonus token from the
//! next position's `p`. The emitted tokens are then distributed exactly as
//! the target's own draws would be.

/// Greedy acceptance: `target[i]` is the target's token after the fed
/// prefix ending with draft `i - 1` (`target.len() == drafts.len() + 1`).
/// Returns how many drafts are accepted and the token that follows them.
pub(crate) fn greedy(drafts: &[i32], target: &[i32]) -> (usize, i32) {
    debug_assert_eq!(target.len(), drafts.len() + 1);
    let a = drafts.iter().zip(target).take_while(|(d, t)| d == t).count();
    (a, target[a])
}

/// The uniform in [0, 1) a sampled request uses for its token at absolute
/// index `index` (`draw` 0: accept or not; 1: which token), from its seed:
/// the same whatever the verify rounds' boundaries were.
pub(crate) fn uniform(seed: u64, index: u64, draw: u64) -> f64 {
    let mut z = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ draw.wrapping_mul(0xD1B5_4A32_D192_ED03);
    // splitmix64's finalizer, twice (seed, index and draw mix fully).
    for _ in 0..2 {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
    }
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// The token whose cumulative mass first passes `u` × the total of `p`,
/// skipping `except`; the last token with mass if rounding runs past it.
pub(crate) fn draw(p: &[f32], except: Option<usize>, u: f64) -> i32 {
    let mass = |i: usize, x: f32| if Some(i) == except { 0.0 } else { x.max(0.0) as f64 };
    let total: f64 = p.iter().enumerate().map(|(i, &x)| mass(i, x)).sum();
    let target = u * total;
    let (mut acc, mut last) = (0.0, 0);
    for (i, &x) in p.iter().enumerate() {
        let m = mass(i, x);
        if m > 0.0 {
            acc += m;
            last = i;
            if acc > target {
                return i as i32;
            }
        }
    }
    last as i32
}

/// Sampled acceptance. `probs[i]` is the target's distribution for the
/// token after the fed prefix ending with draft `i - 1` (`drafts.len() + 1`
/// of them); `first` is the absolute index of the token `probs[0]` chooses.
/// Returns how many drafts are accepted and the token that follows them.
pub(crate) fn sampled(drafts: &[i32], probs: &[&[f32]], seed: u64, first: u64) -> (usize, i32) {
    debug_assert_eq!(probs.len(), drafts.len() + 1);
    for (i, (&d, p)) in drafts.iter().zip(probs).enumerate() {
        let index = first + i as u64;
        let pd = p.get(d as usize).copied().unwrap_or(0.0).max(0.0) as f64;
        if uniform(seed, index, 0) >= pd {
            return (i, draw(p, Some(d as usize), uniform(seed, index, 1)));
        }
    }
    let k = drafts.len();
    (k, draw(probs[k], None, uniform(seed, first + k as u64, 1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_agreeing_prefix_then_the_target() {
        assert_eq!(greedy(&[5, 6, 7], &[5, 6, 9, 1]), (2, 9));
        assert_eq!(greedy(&[5, 6, 7], &[5, 6, 7, 1]), (3, 1), "all accepted: the bonus token");
        assert_eq!(greedy(&[5], &[4, 5]), (0, 4));
        assert_eq!(greedy(&[], &[3]), (0, 3));
    }

    #[test]
    fn draws_follow_the_mass_and_skip_the_excluded_token() {
        let p = [0.0, 0.5, 0.0, 0.5];
        assert_eq!(draw(&p, None, 0.0), 1);
        assert_eq!(draw(&p, None, 0.49), 1);
        assert_eq!(draw(&p, None, 0.51), 3);
        assert_eq!(draw(&p, None, 0.999_999), 3);
        assert_eq!(draw(&p, Some(1), 0.0), 3, "only token 3 is left");
    }

    /// The first emitted token of a round follows the target distribution
    /// exactly, whatever the (one-hot) draft: analytically,
    /// P(t) = p(d)·[t = d] + (1 − p(d))·p(t)/(1 − p(d))·[t ≠ d] = p(t);
    /// here by Monte Carlo over 200k seeds on a 16-token toy, for a likely,
    /// an unlikely and an impossible draft; the second token (after an
    /// accepted first draft) follows the next position's distribution.
    #[test]
    fn rejection_rule_gives_the_target_distribution() {
        let raw: Vec<f32> = (0..16).map(|i| ((i * 7 % 16) as f32 + 0.5).powf(1.5)).collect();
        let total: f32 = raw.iter().sum();
        let mut p: Vec<f32> = raw.iter().map(|x| x / total).collect();
        p[3] = 0.0;
        let renorm: f32 = p.iter().sum();
        p.iter_mut().for_each(|x| *x /= renorm);
        let q: Vec<f32> = p.iter().rev().copied().collect();
        let likely = p.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0 as i32;
        let n = 200_000u64;
        for draft in [likely, 0, 3] {
            let mut first = [0u64; 16];
            let mut second = [0u64; 16];
            let mut second_n = 0u64;
            for seed in 0..n {
                let (a, t) = sampled(&[draft, 5], &[&p, &q, &p], seed, 100);
                let t0 = if a == 0 { t } else { draft };
                first[t0 as usize] += 1;
                if a >= 1 {
                    let t1 = if a == 1 { t } else { 5 };
                    second[t1 as usize] += 1;
                    second_n += 1;
                }
            }
            for i in 0..16 {
                let f = first[i] as f64 / n as f64;
                assert!((f - p[i] as f64).abs() < 0.006, "draft {draft}, token {i}: {f} vs {}", p[i]);
                if second_n > 10_000 {
                    let f = second[i] as f64 / second_n as f64;
                    assert!((f - q[i] as f64).abs() < 0.012, "draft {draft}, second token {i}: {f} vs {}", q[i]);
                }
            }
            assert_eq!(first[3], 0, "a zero-probability token is never emitted");
        }
    }

    #[test]
    fn uniforms_are_keyed_by_seed_index_and_draw() {
        assert_eq!(uniform(7, 3, 0), uniform(7, 3, 0));
        let all = [uniform(7, 3, 0), uniform(7, 3, 1), uniform(7, 4, 0), uniform(8, 3, 0)];
        for (i, a) in all.iter().enumerate() {
            assert!((0.0..1.0).contains(a));
            assert!(all[i + 1..].iter().all(|b| b != a), "{all:?}");
        }
    }
}
