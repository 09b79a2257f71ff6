//! Token selection on the device, with mlx-lm's semantics: logits processors
//! (repetition penalty), then log-softmax, then filters (top-p, min-p, top-k)
//! and a categorical draw at the given temperature, or argmax when it is 0.
//! Draws use an explicit per-request key, so a seed reproduces a request's
//! output regardless of what else the engine runs.

use crate::error::{Error, Result};
use crate::mlx::{random, Array};

#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1); 0 or 1 = off.
    pub top_p: f32,
    /// Minimum probability relative to the top token; 0 = off.
    pub min_p: f32,
    /// Keep the k most likely tokens; 0 = off.
    pub top_k: i32,
    /// Multiplicative penalty on recently seen tokens; 1 (or 0) = off.
    pub repetition_penalty: f32,
    /// How many recent tokens (prompt included) the penalty looks at.
    pub repetition_context_size: usize,
    /// Seed for the draws; None = a fresh seed per request.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 0.0,
            min_p: 0.0,
            top_k: 0,
            repetition_penalty: 1.0,
            repetition_context_size: 20,
            seed: None,
        }
    }
}

impl SamplingParams {
    /// Rejects values mlx-lm would reject (or that make no sense).
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::invalid(m));
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad(format!("temperature must be a finite number >= 0, got {}", self.temperature));
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return bad(format!("top_p must be in [0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if self.top_k < 0 {
            return bad(format!("top_k must be >= 0, got {}", self.top_k));
        }
        if !self.repetition_penalty.is_finite() || self.repetition_penalty < 0.0 {
            return bad(format!("repetition_penalty must be >= 0, got {}", self.repetition_penalty));
        }
        Ok(())
    }

    fn penalizes(&self) -> bool {
        self.repetition_penalty != 0.0 && self.repetition_penalty != 1.0 && self.repetition_context_size > 0
    }
}

/// Per-request sampling state (the random key advances every draw).
pub struct Sampler {
    params: SamplingParams,
    key: Option<Array>,
}

/// One selected token (shape `[1]`, int32, lazy) and the log-probabilities it
/// was drawn from (`[1, vocab]`, lazy; mlx-lm's: after logits processors,
/// before temperature and filters).
pub struct Draw {
    pub token: Array,
    pub logprobs: Array,
}

impl Sampler {
    pub fn new(params: SamplingParams, fallback_seed: u64) -> Result<Sampler> {
        let key = if params.temperature > 0.0 {
            Some(random::key(params.seed.unwrap_or(fallback_seed))?)
        } else {
            None
        };
        Ok(Sampler { params, key })
    }

    /// Whether draws are argmax (temperature 0).
    pub fn is_greedy(&self) -> bool {
        self.key.is_none()
    }

    /// Whether `draw` needs the recent token history.
    pub fn needs_history(&self) -> bool {
        self.params.penalizes()
    }

    pub fn context_size(&self) -> usize {
        self.params.repetition_context_size
    }

    /// Selects the next token from `logits` (`[1, vocab]`). `history` holds the
    /// most recent token ids (at most `context_size`) when `needs_history`.
    pub fn draw(&mut self, logits: &Array, history: Option<&Array>) -> Result<Draw> {
        let processed = self.processed(logits, history)?;
        let logprobs = log_softmax(&processed)?;
        let token = match self.key.take() {
            // The argmax of the logits is that of the log-probabilities
            // (one number is subtracted from all), without waiting for
            // the normalizer: on a CPU MLX's logsumexp costs ~0.3 ms per
            // position, a speculative verify step's 11 positions ~6 ms. The
            // log-probabilities stay lazy, computed only when read.
            None => processed.argmax(-1, false)?,
            Some(key) => {
                let (next, now) = random::split(&key)?;
                self.key = Some(next);
                random::categorical(&self.filtered(&logprobs)?.mul_scalar(1.0 / self.params.temperature)?, &now)?
            }
        };
        Ok(Draw { token, logprobs })
    }

    /// The probabilities a sampled draw picks from (`[1, vocab]` f32: penalty,
    /// filters, temperature), for speculative decoding's acceptance rule.
    pub fn probs(&self, logits: &Array, history: Option<&Array>) -> Result<Array> {
        let lp = self.filtered(&self.logprobs(logits, history)?)?.mul_scalar(1.0 / self.params.temperature.max(1e-6))?;
        Ok(log_softmax(&lp)?.exp()?)
    }

    /// Log-probabilities after the logits processors (the repetition penalty).
    fn logprobs(&self, logits: &Array, history: Option<&Array>) -> Result<Array> {
        log_softmax(&self.processed(logits, history)?)
    }

    /// f32 logits after the logits processors (the repetition penalty).
    fn processed(&self, logits: &Array, history: Option<&Array>) -> Result<Array> {
        let p = &self.params;
        let logits = logits.astype(crate::mlx::Dtype::F32)?;
        match (p.penalizes(), history) {
            (true, Some(h)) => repetition_penalty(&logits, h, p.repetition_penalty),
            _ => Ok(logits),
        }
    }

    /// `logprobs` with the top-p, min-p and top-k filters applied.
    fn filtered(&self, logprobs: &Array) -> Result<Array> {
        let p = &self.params;
        let mut lp = logprobs.share();
        if p.top_p > 0.0 && p.top_p < 1.0 {
            lp = top_p(&lp, p.top_p)?;
        }
        if p.min_p > 0.0 {
            lp = min_p(&lp, p.min_p)?;
        }
        if p.top_k > 0 && p.top_k < lp.dim(-1) {
            lp = top_k(&lp, p.top_k)?;
        }
        Ok(lp)
    }
}

/// `x - logsumexp(x)` over the last axis: log-probabilities from logits.
pub fn log_softmax(x: &Array) -> Result<Array> {
    Ok(x.subtract(&x.logsumexp(-1, true)?)?)
}

fn neg_inf() -> Result<Array> {
    Ok(Array::scalar_f32(f32::NEG_INFINITY)?)
}

/// Divides positive (multiplies negative) logits of recently seen tokens.
fn repetition_penalty(logits: &Array, history: &Array, penalty: f32) -> Result<Array> {
    let idx = history.reshape(&[1, -1])?;
    let sel = logits.take_along_axis(&idx, -1)?;
    let zero = Array::scalar_f32(0.0)?;
    let pen = Array::select(&sel.less(&zero)?, &sel.mul_scalar(penalty)?, &sel.mul_scalar(1.0 / penalty)?)?;
    Ok(logits.put_along_axis(&idx, &pen, -1)?)
}

/// Keeps the smallest set of most likely tokens whose mass reaches `p`.
fn top_p(logprobs: &Array, p: f32) -> Result<Array> {
    let sorted = logprobs.sort(-1)?;
    let probs = sorted.exp()?;
    let above = probs.cumsum(-1, true, false)?;
    let total = above.slice_axis(-1, 0, 1)?.add(&probs.slice_axis(-1, 0, 1)?)?;
    let dropped = above.greater_equal(&total.mul_scalar(p)?)?.astype(crate::mlx::Dtype::I32)?.sum(-1, true)?;
    let threshold = sorted.take_along_axis(&dropped, -1)?;
    Ok(Array::select(&logprobs.less(&threshold)?, &neg_inf()?, logprobs)?)
}

/// Drops tokens less likely than `p` × the top token's probability.
fn min_p(logprobs: &Array, p: f32) -> Result<Array> {
    let cut = logprobs.max(-1, true)?.add_scalar(p.ln())?;
    Ok(Array::select(&logprobs.less(&cut)?, &neg_inf()?, logprobs)?)
}

/// Keeps the `k` most likely tokens.
fn top_k(logprobs: &Array, k: i32) -> Result<Array> {
    let v = logprobs.dim(-1);
    let order = logprobs.negative()?.argpartition(k - 1, -1)?;
    let drop = order.slice_axis(-1, k, v)?;
    let fill = neg_inf()?.broadcast_to(&drop.shape())?;
    Ok(logprobs.put_along_axis(&drop, &fill, -1)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits(v: &[f32]) -> Array {
        Array::from_f32(v, &[1, v.len() as i32]).unwrap()
    }

    #[test]
    fn greedy_picks_the_max() {
        let mut s = Sampler::new(SamplingParams::default(), 0).unwrap();
        let d = s.draw(&logits(&[0.0, 3.0, 1.0]), None).unwrap();
        assert_eq!(d.token.to_vec_i32().unwrap(), vec![1]);
        let lp = d.logprobs.to_vec_f32().unwrap();
        let total: f32 = lp.iter().map(|x| x.exp()).sum();
        assert!((total - 1.0).abs() < 1e-5);
    }

    #[test]
    fn same_seed_same_draws_and_filters_restrict_support() {
        let l = logits(&[1.0, 1.1, 0.9, 1.05, -5.0, 0.2]);
        let params = SamplingParams { temperature: 1.0, seed: Some(42), ..Default::default() };
        let run = |p: &SamplingParams| -> Vec<i32> {
            let mut s = Sampler::new(p.clone(), 0).unwrap();
            (0..64).map(|_| s.draw(&l, None).unwrap().token.item_i32().unwrap()).collect()
        };
        let a = run(&params);
        assert_eq!(a, run(&params));
        assert!(a.iter().collect::<std::collections::HashSet<_>>().len() > 2, "draws should vary: {a:?}");
        let k2 = run(&SamplingParams { top_k: 2, ..params.clone() });
        assert!(k2.iter().all(|t| *t == 1 || *t == 3), "{k2:?}");
        let mp = run(&SamplingParams { min_p: 0.5, ..params.clone() });
        assert!(mp.iter().all(|t| *t <= 3), "{mp:?}");
        let tp = run(&SamplingParams { top_p: 0.3, ..params.clone() });
        assert!(tp.iter().all(|t| *t == 1 || *t == 3), "{tp:?}");
    }

    #[test]
    fn repetition_penalty_follows_sign() {
        let l = logits(&[2.0, -2.0, 1.0]);
        let h = Array::from_i32(&[0, 1], &[2]).unwrap();
        let out = repetition_penalty(&l, &h, 2.0).unwrap().to_vec_f32().unwrap();
        assert_eq!(out, vec![1.0, -4.0, 1.0]);
    }

    #[test]
    fn invalid_params_are_rejected() {
        for p in [
            SamplingParams { temperature: -1.0, ..Default::default() },
            SamplingParams { temperature: f32::NAN, ..Default::default() },
            SamplingParams { top_p: 1.5, ..Default::default() },
            SamplingParams { min_p: -0.1, ..Default::default() },
            SamplingParams { top_k: -3, ..Default::default() },
        ] {
            assert!(p.validate().is_err(), "{p:?}");
        }
        assert!(SamplingParams::default().validate().is_ok());
    }
}
