//! Scheduler tracing: timed spans of each iteration's work (cache lookup and
//! restore, batch setup, forward, evaluation, KV maintenance, snapshots,
//! sampling, delivery), handed to an optional host callback and summarised
//! per kind (count, total, p95) in the engine's stats.
//!
//! MLX is lazy: a forward span times building the step's graph. Computing
//! it runs from the span that starts it (sample, whose `async_eval` may run
//! most of a decode step on the CPU) to the evaluate span that waits for the
//! results (prefill: the cache state; decode: reading the drawn tokens).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a span timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// Looking a prompt up in the prompt cache, or restoring a hit's caches.
    LookupRestore = 0,
    /// Building a prefill cohort's caches, a row joining it, or a finished
    /// cohort joining the decode batch.
    BatchSetup = 1,
    /// One model call (a prefill chunk or a decode step): building its graph.
    /// Computing it lands in `Sample` (which starts a decode step) and
    /// `Evaluate`.
    Forward = 2,
    /// Waiting for a forward's results (prefill cache state, decoded tokens).
    Evaluate = 3,
    /// Dropping rows that ended or were cancelled from their caches.
    KvMaintenance = 4,
    /// Taking a prompt-cache snapshot of one row.
    Snapshot = 5,
    /// Drawing tokens from logits, and starting the step's computation.
    Sample = 6,
    /// Handing tokens to their requests (detokenizing, stop strings, events).
    Deliver = 7,
}

impl SpanKind {
    /// Every kind, in the order of their values.
    pub const ALL: [SpanKind; SPAN_KINDS] = [
        SpanKind::LookupRestore,
        SpanKind::BatchSetup,
        SpanKind::Forward,
        SpanKind::Evaluate,
        SpanKind::KvMaintenance,
        SpanKind::Snapshot,
        SpanKind::Sample,
        SpanKind::Deliver,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SpanKind::LookupRestore => "lookup_restore",
            SpanKind::BatchSetup => "batch_setup",
            SpanKind::Forward => "forward",
            SpanKind::Evaluate => "evaluate",
            SpanKind::KvMaintenance => "kv_maintenance",
            SpanKind::Snapshot => "snapshot",
            SpanKind::Sample => "sample",
            SpanKind::Deliver => "deliver",
        }
    }
}

/// How many span kinds there are.
pub const SPAN_KINDS: usize = 8;

/// One timed piece of scheduler work.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Span {
    pub kind: SpanKind,
    /// The scheduler iteration it belongs to, counting from 1; lookups of
    /// arriving requests, between iterations, carry the last one's (0
    /// before the first).
    pub iteration: u64,
    /// Requests (rows) the work was for.
    pub rows: usize,
    /// Tokens it processed: positions forwarded (rows × chunk, padding
    /// included), tokens drawn or delivered, prompt tokens looked up,
    /// restored or snapshotted.
    pub tokens: usize,
    /// When it began, since the engine started.
    pub start: Duration,
    pub duration: Duration,
}

/// Receives every span on the scheduler thread, as it ends. It must be
/// quick (the model waits) and must not call into the engine.
pub type TraceFn = Arc<dyn Fn(&Span) + Send + Sync>;

/// The summary of one span kind in `EngineStats::spans`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SpanStats {
    pub count: u64,
    pub total_ms: f64,
    /// 95th percentile of the durations, within 5% (a log histogram).
    pub p95_ms: f64,
}

/// Histogram buckets: `PER_OCTAVE` per doubling from 1 µs, up to ~2^32 µs.
const PER_OCTAVE: usize = 16;
const BUCKETS: usize = 32 * PER_OCTAVE;

/// Durations of one kind since the engine started.
struct KindSummary {
    count: u64,
    total: Duration,
    hist: Box<[u64; BUCKETS]>,
}

impl Default for KindSummary {
    fn default() -> Self {
        KindSummary { count: 0, total: Duration::ZERO, hist: Box::new([0; BUCKETS]) }
    }
}

fn bucket(d: Duration) -> usize {
    let us = d.as_secs_f64() * 1e6;
    if us <= 1.0 {
        return 0;
    }
    ((us.log2() * PER_OCTAVE as f64).ceil() as usize).min(BUCKETS - 1)
}

/// The upper edge of bucket `b`, in ms.
fn bucket_ms(b: usize) -> f64 {
    2f64.powf(b as f64 / PER_OCTAVE as f64) / 1e3
}

impl KindSummary {
    fn add(&mut self, d: Duration) {
        self.count += 1;
        self.total += d;
        self.hist[bucket(d)] += 1;
    }

    fn stats(&self) -> SpanStats {
        let mut p95_ms = 0.0;
        if self.count > 0 {
            let want = (self.count as f64 * 0.95).ceil() as u64;
            let mut seen = 0;
            for (b, &n) in self.hist.iter().enumerate() {
                seen += n;
                if seen >= want {
                    p95_ms = bucket_ms(b);
                    break;
                }
            }
        }
        SpanStats { count: self.count, total_ms: self.total.as_secs_f64() * 1e3, p95_ms }
    }
}

/// The counters and span summaries shared with the engine handle.
#[derive(Default)]
pub(crate) struct TraceStats {
    /// Scheduler iterations that had work.
    pub iterations: AtomicU64,
    /// Model forward calls.
    pub model_calls: AtomicU64,
    /// Forward calls that ran decoding rows and a prefill chunk together.
    pub mixed_steps: AtomicU64,
    kinds: Mutex<[KindSummary; SPAN_KINDS]>,
}

impl std::fmt::Debug for TraceStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TraceStats(iterations: {:?})", self.iterations)
    }
}

impl TraceStats {
    pub fn spans(&self) -> [SpanStats; SPAN_KINDS] {
        let k = self.kinds.lock().unwrap_or_else(|p| p.into_inner());
        std::array::from_fn(|i| k[i].stats())
    }
}

/// The scheduler's side: times spans, summarises them and calls the host.
pub(crate) struct Tracer {
    callback: Option<TraceFn>,
    epoch: Instant,
    iteration: u64,
    stats: Arc<TraceStats>,
}

impl Tracer {
    pub fn new(callback: Option<TraceFn>, stats: Arc<TraceStats>) -> Tracer {
        Tracer { callback, epoch: Instant::now(), iteration: 0, stats }
    }

    /// Starts a new iteration: spans recorded from now on belong to it.
    pub fn next_iteration(&mut self) {
        self.iteration += 1;
        self.stats.iterations.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one model forward call.
    pub fn model_call(&self) {
        self.stats.model_calls.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a model call (also counted by `model_call`) that ran decoding
    /// rows and a prefill chunk together.
    pub fn mixed_step(&self) {
        self.stats.mixed_steps.fetch_add(1, Ordering::Relaxed);
    }

    /// Records a span of `kind` that began at `start` and ends now.
    pub fn record(&self, kind: SpanKind, rows: usize, tokens: usize, start: Instant) {
        let duration = start.elapsed();
        self.stats.kinds.lock().unwrap_or_else(|p| p.into_inner())[kind as usize].add(duration);
        if let Some(f) = &self.callback {
            let span = Span {
                kind,
                iteration: self.iteration,
                rows,
                tokens,
                start: start.saturating_duration_since(self.epoch),
                duration,
            };
            // A panicking host callback must not take the scheduler down.
            let _ = catch_unwind(AssertUnwindSafe(|| f(&span)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p95_is_within_five_percent() {
        let mut s = KindSummary::default();
        for ms in 1..=100 {
            s.add(Duration::from_millis(ms));
        }
        let st = s.stats();
        assert_eq!(st.count, 100);
        assert!((st.total_ms - 5050.0).abs() < 1e-6, "{st:?}");
        assert!(st.p95_ms >= 95.0 && st.p95_ms <= 95.0 * 1.05, "{st:?}");
        assert_eq!(KindSummary::default().stats(), SpanStats::default());
    }
}
