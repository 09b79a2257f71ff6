//! The admission and prefill planner: a pure function of the scheduler's
//! state, so its policy is testable without a model.
//!
//! Policy:
//! - FIFO: requests are admitted strictly in arrival order; a request that
//!   cannot be admitted yet (rows or KV memory) holds back those behind it, so
//!   nothing starves behind a stream of smaller requests.
//! - A new cohort starts with the head of the queue and takes the following
//!   requests while rows and KV memory allow and padding stays within 1/3 of
//!   the cohort's positions (its rows are aligned on their last position).
//! - A running cohort takes arrivals, fresh or with a cached prefix, each
//!   starting at the cohort's current position and keeping its own end,
//!   while the prompt positions its rows process (the seed's token weight:
//!   `Σ prompt − cached`, counted until they leave) stay within
//!   `join_tokens`. Without paged KV a cached prefix longer than what the
//!   cohort has processed does not join (it would pad every row in front).
//! - With no cohort running, a request with a cached prefix starts one of
//!   its own (its cache begins part-way); one whose prefix is being read
//!   from disk, or being prefilled by a row ahead of it (prefix sharing,
//!   `prefix_share`), waits. Requests that map a concurrent row's blocks
//!   start together, each from all of its shared prefix.
//! - Prefill chunk: a request's own `prefill_chunk`, exactly (the smallest
//!   among the cohort's rows); else with nothing decoding the engine's
//!   prefill chunk (latency of others does not matter), and with rows
//!   decoding the per-step token budget split over the cohort's rows, at
//!   most the pacing cap (see `pacing`), so decode steps keep coming.

/// A waiting request, as the planner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Waiting {
    pub prompt_len: usize,
    pub kv_need: usize,
    /// Per-request prefill chunk limit.
    pub chunk: Option<usize>,
    /// Leading prompt tokens the prompt cache holds.
    pub cached: usize,
    /// It waits for its cached prefix: being read from disk, or being
    /// prefilled by a row ahead of it.
    pub waits: bool,
    /// Its cached prefix maps a concurrent row's blocks (`prefix_share`):
    /// it may start in one cohort with others that do.
    pub shared: bool,
    /// A media prompt: it prefills alone, in one forward.
    pub media: bool,
}

/// The running cohort, as the planner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CohortView {
    pub rows: usize,
    /// Positions processed (of its timeline, padding included).
    pub done: usize,
    /// Prompt positions its rows process, cached ones not counted.
    pub weight: usize,
    /// Smallest per-request chunk limit among its rows.
    pub chunk: Option<usize>,
    /// A media prompt's cohort: nothing joins it.
    pub atomic: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    pub max_rows: usize,
    pub kv_budget: usize,
    pub prefill_chunk: usize,
    pub step_budget: usize,
    /// Per-row positions a chunk may take while rows decode (pacing).
    pub pace_cap: usize,
    /// A running cohort's token weight after a join is at most this.
    pub join_tokens: usize,
    /// Full-attention KV is paged: padding costs no memory.
    pub paged: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct State<'a> {
    pub decoding: usize,
    pub cohort: Option<CohortView>,
    pub waiting: &'a [Waiting],
    pub kv_reserved: usize,
}

/// Which queued requests to admit, and how: the scheduler executes this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    Nothing,
    /// The first `n` queued requests join the running cohort.
    Join(usize),
    /// The first `n` queued requests start a new cohort.
    NewCohort(usize),
    /// The first `n` queued requests start a cohort from their cached
    /// prefixes (`n` > 1 only for rows mapping concurrent rows' blocks).
    FromCache(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    pub admit: Admit,
    /// Positions per row the cohort may process this iteration.
    pub chunk: usize,
}

pub(crate) fn plan(s: &State, l: &Limits) -> Plan {
    let mut rows = s.decoding + s.cohort.map_or(0, |c| c.rows);
    let mut kv = s.kv_reserved;
    let fits = |w: &Waiting, rows: usize, kv: usize| rows < l.max_rows && kv + w.kv_need <= l.kv_budget;
    let mut admit = 0;
    // A new cohort starts from cached prefixes.
    let mut hits = false;
    let mut chunk_pref = s.cohort.and_then(|c| c.chunk);
    let mut cohort_rows = s.cohort.map_or(0, |c| c.rows);
    let mut weight = s.cohort.map_or(0, |c| c.weight);
    // Padding bookkeeping of a new cohort: its aligned length and real tokens.
    let (mut total, mut real) = (0usize, 0usize);
    for w in s.waiting {
        if w.waits || !fits(w, rows, kv) {
            break;
        }
        // A media prompt starts a cohort of its own, which nothing joins.
        if s.cohort.is_some_and(|c| c.atomic) || (w.media && (s.cohort.is_some() || admit > 0)) {
            break;
        }
        match s.cohort {
            Some(c) => {
                let work = w.prompt_len - w.cached;
                if weight + work > l.join_tokens || (!l.paged && w.cached > c.done) {
                    break;
                }
                weight += work;
            }
            // Rows mapping concurrent rows' blocks start together.
            None if hits && !w.shared => break,
            None if hits => {}
            None if w.cached > 0 && admit > 0 => break,
            // Later arrivals may join once it runs.
            None if w.cached > 0 => hits = true,
            None => {
                let t = total.max(w.prompt_len);
                let r = real + w.prompt_len;
                // Keep padding below a third of all positions.
                if admit > 0 && 2 * t * (cohort_rows + 1) > 3 * r {
                    break;
                }
                (total, real) = (t, r);
            }
        }
        admit += 1;
        rows += 1;
        kv += w.kv_need;
        cohort_rows += 1;
        chunk_pref = match (chunk_pref, w.chunk) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // A prompt-cache hit starts a new cohort alone.
        if s.cohort.is_none() && (w.media || (w.cached > 0 && !w.shared)) {
            break;
        }
    }
    let full = l.prefill_chunk.max(1);
    let chunk = match chunk_pref {
        Some(c) => c.max(1),
        None if s.decoding == 0 => full,
        None => (l.step_budget / cohort_rows.max(1)).min(l.pace_cap).clamp(1, full),
    };
    let admit = match (admit, s.cohort) {
        (0, _) => Admit::Nothing,
        (n, Some(_)) => Admit::Join(n),
        (n, None) if hits => Admit::FromCache(n),
        (n, None) => Admit::NewCohort(n),
    };
    Plan { admit, chunk }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Limits =
        Limits { max_rows: 4, kv_budget: 1000, prefill_chunk: 2048, step_budget: 256, pace_cap: 1000, join_tokens: 2048, paged: false };

    fn cohort(rows: usize, done: usize, weight: usize) -> Option<CohortView> {
        Some(CohortView { rows, done, weight, chunk: None, atomic: false })
    }

    fn w(len: usize, kv: usize) -> Waiting {
        Waiting { prompt_len: len, kv_need: kv, chunk: None, cached: 0, waits: false, shared: false, media: false }
    }

    #[test]
    fn media_prompts_prefill_alone() {
        let m = Waiting { media: true, ..w(100, 10) };
        let st = |cohort, q: &[Waiting]| plan(&State { decoding: 2, cohort, waiting: q, kv_reserved: 0 }, &L).admit;
        assert_eq!(st(None, &[m, w(90, 10)]), Admit::NewCohort(1), "nothing joins a media prompt's new cohort");
        assert_eq!(st(None, &[w(90, 10), m]), Admit::NewCohort(1), "a media prompt joins no cohort");
        let running = cohort(1, 10, 500);
        assert_eq!(st(running, &[m]), Admit::Nothing, "it waits for the running cohort");
        let atomic = Some(CohortView { atomic: true, ..running.unwrap() });
        assert_eq!(st(atomic, &[w(10, 10)]), Admit::Nothing, "nothing joins a media cohort");
    }

    #[test]
    fn admits_in_order_up_to_rows_and_memory() {
        let q = [w(100, 100), w(90, 100), w(120, 100), w(100, 100), w(100, 100)];
        let p = plan(&State { decoding: 0, cohort: None, waiting: &q, kv_reserved: 0 }, &L);
        assert_eq!(p, Plan { admit: Admit::NewCohort(4), chunk: 2048 });
        // memory: only 2 fit
        let p = plan(&State { decoding: 1, cohort: None, waiting: &q, kv_reserved: 750 }, &L);
        assert_eq!(p.admit, Admit::NewCohort(2));
        assert_eq!(p.chunk, 128, "a decoding batch splits the step budget over the cohort");
    }

    #[test]
    fn a_blocked_head_holds_back_the_queue() {
        let q = [w(100, 900), w(10, 10)];
        let p = plan(&State { decoding: 1, cohort: None, waiting: &q, kv_reserved: 200 }, &L);
        assert_eq!(p.admit, Admit::Nothing, "the small request must not overtake the big one");
    }

    #[test]
    fn cohort_padding_is_bounded() {
        // 1000 then 100: padding would be 900 of 2000 positions (> 1/3).
        let q = [w(1000, 10), w(100, 10)];
        let p = plan(&State { decoding: 0, cohort: None, waiting: &q, kv_reserved: 0 }, &L);
        assert_eq!(p.admit, Admit::NewCohort(1));
        let q = [w(100, 10), w(80, 10), w(90, 10)];
        assert_eq!(plan(&State { decoding: 0, cohort: None, waiting: &q, kv_reserved: 0 }, &L).admit, Admit::NewCohort(3));
    }

    #[test]
    fn arrivals_join_a_running_cohort_within_its_token_weight() {
        let st = |c, q: &[Waiting], l: &Limits| plan(&State { decoding: 0, cohort: c, waiting: q, kv_reserved: 0 }, l).admit;
        // 1900 positions to process already: a 100-token prompt fits, 200 do not.
        let q = [w(100, 10), w(60, 10)];
        assert_eq!(st(cohort(1, 50, 1900), &q, &L), Admit::Join(1));
        assert_eq!(st(cohort(1, 50, 1800), &q, &L), Admit::Join(2));
        // A prompt longer than what the cohort has left to do joins too (it
        // keeps its own end), and a cached prefix counts only what is left.
        assert_eq!(st(cohort(1, 50, 100), &[w(1500, 10)], &L), Admit::Join(1));
        let hit = Waiting { cached: 40, ..w(1000, 10) };
        assert_eq!(st(cohort(1, 50, 1080), &[hit], &L), Admit::Join(1), "960 more positions fit");
        assert_eq!(st(cohort(1, 50, 1080), &[Waiting { cached: 0, ..hit }], &L), Admit::Nothing);
        // Without paging a prefix longer than the cohort's progress would pad
        // every row in front: it waits.
        let long = Waiting { cached: 64, ..w(100, 10) };
        assert_eq!(st(cohort(2, 50, 100), &[long, w(10, 10)], &L), Admit::Nothing);
        assert_eq!(st(cohort(2, 64, 100), &[long, w(10, 10)], &L), Admit::Join(2), "hits and misses join together");
        let paged = Limits { paged: true, ..L };
        assert_eq!(st(cohort(2, 50, 100), &[long], &paged), Admit::Join(1));
        // Still bounded by rows and memory, and a waiting head holds the rest.
        assert_eq!(st(cohort(3, 50, 100), &[w(10, 10), w(10, 10)], &L), Admit::Join(1));
        assert_eq!(st(cohort(1, 50, 100), &[Waiting { waits: true, ..w(10, 10) }, w(10, 10)], &L), Admit::Nothing);
    }

    #[test]
    fn rows_mapping_concurrent_blocks_start_together() {
        let sh = |len, cached| Waiting { cached, shared: true, ..w(len, 10) };
        let st = |q: &[Waiting]| plan(&State { decoding: 1, cohort: None, waiting: q, kv_reserved: 0 }, &L).admit;
        assert_eq!(st(&[sh(100, 64), sh(100, 64), sh(98, 64)]), Admit::FromCache(3));
        // Each maps all it shares (the cohort keeps each row's end).
        assert_eq!(st(&[sh(100, 90), sh(98, 30)]), Admit::FromCache(2));
        // A prompt-cache hit (not shared) starts alone; a miss does not join.
        let pc = Waiting { cached: 64, ..w(100, 10) };
        assert_eq!(st(&[pc, sh(100, 64)]), Admit::FromCache(1));
        assert_eq!(st(&[sh(100, 64), w(100, 10)]), Admit::FromCache(1));
        // Rows still limited by max_rows.
        assert_eq!(st(&[sh(100, 64); 6]), Admit::FromCache(3));
    }

    #[test]
    fn pacing_caps_chunks_only_while_decoding() {
        let q = [w(100, 10)];
        let l = Limits { pace_cap: 8, ..L };
        assert_eq!(plan(&State { decoding: 0, cohort: None, waiting: &q, kv_reserved: 0 }, &l).chunk, 2048);
        assert_eq!(plan(&State { decoding: 3, cohort: None, waiting: &q, kv_reserved: 0 }, &l).chunk, 8);
    }

    #[test]
    fn per_request_chunks_and_budget() {
        let q = [Waiting { chunk: Some(64), ..w(100, 1) }];
        let p = plan(&State { decoding: 0, cohort: None, waiting: &q, kv_reserved: 0 }, &L);
        assert_eq!(p.chunk, 64);
        // Exactly: neither the step budget, the pacing cap nor the engine's
        // chunk changes a request's own.
        let l = Limits { pace_cap: 8, prefill_chunk: 32, ..L };
        let p = plan(&State { decoding: 3, cohort: None, waiting: &q, kv_reserved: 0 }, &l);
        assert_eq!(p.chunk, 64);
        let c = Some(CohortView { chunk: Some(16), ..cohort(2, 10, 100).unwrap() });
        assert_eq!(plan(&State { decoding: 3, cohort: c, waiting: &q, kv_reserved: 0 }, &l).chunk, 16, "the smallest");
        let c = cohort(300, 10, 10);
        let p = plan(&State { decoding: 2, cohort: c, waiting: &[], kv_reserved: 0 }, &L);
        assert_eq!(p, Plan { admit: Admit::Nothing, chunk: 1 });
    }
}
