//! Per-token log-probabilities (opt-in), with mlx-lm's semantics: the
//! log-softmax of the logits after logits processors (repetition penalty)
//! and before temperature or filters; plus the most likely alternatives.

use crate::error::Result;
use crate::mlx::{Array, Dtype};

/// Most alternatives a request may ask for.
pub const MAX_TOP: usize = 20;

/// One generated token's log-probability and the top alternatives (most
/// likely first).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// Lazy per-row figures of one step: the chosen tokens' log-probabilities
/// (`[B]`) and the `MAX_TOP` best ids and values (`[B, MAX_TOP]`, unsorted).
pub(crate) struct StepLogprobs {
    chosen: Array,
    ids: Array,
    vals: Array,
}

impl StepLogprobs {
    /// From log-probabilities `lp` (`[B, vocab]`) and the drawn `tokens` (`[B]`).
    pub fn new(lp: &Array, tokens: &Array) -> Result<StepLogprobs> {
        let k = (MAX_TOP as i32).min(lp.dim(-1));
        let chosen = lp.take_along_axis(&tokens.reshape(&[-1, 1])?.astype(Dtype::I32)?, -1)?.reshape(&[-1])?;
        let ids = lp.negative()?.argpartition(k - 1, -1)?.slice_axis(-1, 0, k)?;
        let vals = lp.take_along_axis(&ids, -1)?;
        Ok(StepLogprobs { chosen, ids, vals })
    }

    /// Placeholders for `n` rows that did not ask for log-probabilities.
    pub fn zeros(n: usize) -> Result<StepLogprobs> {
        let k = MAX_TOP as i32;
        Ok(StepLogprobs {
            chosen: Array::zeros(&[n as i32], Dtype::F32)?,
            ids: Array::zeros(&[n as i32, k], Dtype::I32)?,
            vals: Array::zeros(&[n as i32, k], Dtype::F32)?,
        })
    }

    pub fn arrays(&self) -> [&Array; 3] {
        [&self.chosen, &self.ids, &self.vals]
    }

    /// Rows of `self` then rows of `other`.
    pub fn concat(&self, other: &StepLogprobs) -> Result<StepLogprobs> {
        Ok(StepLogprobs {
            chosen: Array::concatenate(&[&self.chosen, &other.chosen], 0)?,
            ids: Array::concatenate(&[&self.ids, &other.ids], 0)?,
            vals: Array::concatenate(&[&self.vals, &other.vals], 0)?,
        })
    }

    /// The rows `idx` (`[n]` int32).
    pub fn take(&self, idx: &Array) -> Result<StepLogprobs> {
        Ok(StepLogprobs { chosen: self.chosen.take(idx, 0)?, ids: self.ids.take(idx, 0)?, vals: self.vals.take(idx, 0)? })
    }

    /// Reads row figures: for row `r` with token `tokens[r]`, its logprob and
    /// the `top[r]` best alternatives, most likely first.
    pub fn read(&self, tokens: &[u32], top: &[usize]) -> Result<Vec<TokenLogprob>> {
        let chosen = self.chosen.to_vec_f32()?;
        let ids = self.ids.to_vec_i32()?;
        let vals = self.vals.to_vec_f32()?;
        let k = ids.len() / tokens.len().max(1);
        Ok(tokens
            .iter()
            .enumerate()
            .map(|(r, &token)| {
                let mut alts: Vec<(u32, f32)> = (0..k).map(|j| (ids[r * k + j] as u32, vals[r * k + j])).collect();
                alts.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                alts.truncate(top[r]);
                TokenLogprob { token, logprob: chosen[r], top: alts }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chosen_and_sorted_alternatives() {
        let logits: Vec<f32> = (0..30).map(|i| (i as f32 * 0.37).sin()).collect();
        let l = Array::from_f32(&logits, &[1, 30]).unwrap();
        let lp = crate::sample::log_softmax(&l).unwrap();
        let s = StepLogprobs::new(&lp, &Array::from_i32(&[5], &[1]).unwrap()).unwrap();
        let r = &s.read(&[5], &[3]).unwrap()[0];
        let all = lp.to_vec_f32().unwrap();
        assert_eq!((r.token, r.logprob), (5, all[5]));
        let mut best: Vec<(u32, f32)> = all.iter().enumerate().map(|(i, &v)| (i as u32, v)).collect();
        best.sort_by(|a, b| b.1.total_cmp(&a.1));
        assert_eq!(r.top, best[..3].to_vec());
        let two = s.concat(&s).unwrap().take(&Array::from_i32(&[1], &[1]).unwrap()).unwrap();
        assert_eq!(two.read(&[5], &[0]).unwrap()[0].top, vec![]);
    }
}
