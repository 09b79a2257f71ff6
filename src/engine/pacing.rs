//! Keeps decoding rows flowing while a prompt prefills beside them. An
//! iteration that also runs a prefill chunk takes the decode step's time plus
//! the chunk's, so the chunk must stay small for the running requests'
//! inter-token latency to stay within `TARGET` × an unloaded decode step.
//! The cap adapts to measured times (multiplicative increase/decrease), since
//! the cost of a chunk depends on the model, the machine and the batch.

/// Iteration time over decode-step time to aim for. Lower, it gave the
/// same time to first token of a long prompt that arrives beside decoding
/// rows (bench/scheduler.py's itl case, 3 rounds each: 2.5 gave a p95
/// ratio of 2.2-2.4, 1.8 gave 1.57-1.96, 1.6 gives 1.37-1.90; the long
/// prompt's TTFT within noise), since the prompt prefills mostly after those
/// rows end.
const TARGET: f64 = 1.6;
/// Below this ratio the cap grows.
const GROW_BELOW: f64 = 1.4;

pub(crate) struct Pacer {
    /// Exponential moving average of a decode-only iteration, in ms.
    decode_ms: Option<f64>,
    /// Prompt positions per row a chunk may take while rows decode.
    cap: usize,
    max: usize,
}

impl Pacer {
    pub fn new(max: usize) -> Pacer {
        Pacer { decode_ms: None, cap: max.min(16), max }
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// An iteration that only decoded.
    pub fn decoded(&mut self, ms: f64) {
        self.decode_ms = Some(match self.decode_ms {
            Some(avg) => 0.8 * avg + 0.2 * ms,
            None => ms,
        });
    }

    /// An iteration that decoded and prefilled a chunk.
    pub fn decoded_and_prefilled(&mut self, ms: f64) {
        let Some(decode) = self.decode_ms else { return };
        let ratio = ms / decode;
        if ratio > TARGET {
            self.cap = ((self.cap as f64 * (TARGET / ratio).max(0.5)) as usize).max(1);
        } else if ratio < GROW_BELOW {
            self.cap = (self.cap + self.cap / 4 + 1).min(self.max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shrinks_when_slow_and_grows_when_fast() {
        let mut p = Pacer::new(256);
        assert_eq!(p.cap(), 16);
        p.decoded(20.0);
        p.decoded_and_prefilled(100.0); // 5x: halve
        assert_eq!(p.cap(), 8);
        p.decoded_and_prefilled(40.0); // 2x: shrink a little
        assert_eq!(p.cap(), 6);
        p.decoded_and_prefilled(30.0); // 1.5x: hold
        assert_eq!(p.cap(), 6);
        for _ in 0..40 {
            p.decoded_and_prefilled(26.0); // 1.3x: grow up to the max
        }
        assert_eq!(p.cap(), 256);
        p.decoded_and_prefilled(10_000.0);
        assert_eq!(p.cap(), 128, "never shrinks by more than half at once");
    }

    #[test]
    fn waits_for_a_decode_measurement() {
        let mut p = Pacer::new(64);
        p.decoded_and_prefilled(1000.0);
        assert_eq!(p.cap(), 16);
    }
}
