//! The admission and prefill planner: a pure function of the scheduler's
//! state, so its policy is testable without a model.
//!
//! Policy:
//! - FIFO: requests are admitted strictly in arrival order; a request that
//!   cannot be admitted yet (rows or KV memory) holds back those behind it, so
//!   nothing starves behind a stream of smaller requests.
//! - A new cohort starts with the head of the queue and takes the following
//!   requests while rows and KV memory allow and padding stays within 1/3 of
//!   the cohort's positions. A running cohort takes arrivals whose prompts fit
//!   in its unprocessed positions.
//! - A request with a cached prefix starts a cohort of its own (its cache
//!   begins part-way); one whose prefix is being read from disk waits.
//! - Prefill chunk: with nothing decoding, the prefill chunk size (latency of
//!   others does not matter); with rows decoding, the per-step token budget
//!   split over the cohort's rows, and at most the pacing cap (see
//!   `pacing`), so decode steps keep coming.

/// A waiting request, as the planner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Waiting {
    pub prompt_len: usize,
    pub kv_need: usize,
    /// Per-request prefill chunk limit.
    pub chunk: Option<usize>,
    /// Leading prompt tokens the prompt cache holds.
    pub cached: usize,
    /// A longer cached prefix is being read from disk.
    pub loading: bool,
    /// A media prompt: it prefills alone, in one forward.
    pub media: bool,
}

/// The running cohort, as the planner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CohortView {
    pub rows: usize,
    /// Unprocessed positions.
    pub remaining: usize,
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
    /// The head of the queue starts a cohort of its own from its first
    /// `n` prompt tokens, which the prompt cache holds.
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
    let mut from_cache = None;
    let mut chunk_pref = s.cohort.and_then(|c| c.chunk);
    let mut cohort_rows = s.cohort.map_or(0, |c| c.rows);
    // Padding bookkeeping of a new cohort: its aligned length and real tokens.
    let (mut total, mut real) = (0usize, 0usize);
    for w in s.waiting {
        if w.loading || !fits(w, rows, kv) {
            break;
        }
        // A media prompt starts a cohort of its own, which nothing joins.
        if s.cohort.is_some_and(|c| c.atomic) || (w.media && (s.cohort.is_some() || admit > 0)) {
            break;
        }
        match s.cohort {
            Some(c) if w.prompt_len > c.remaining || w.cached > 0 => break,
            Some(_) => {}
            None if w.cached > 0 && admit > 0 => break,
            None if w.cached > 0 => {
                // Alone; later arrivals may join once it runs.
                from_cache = Some(w.cached);
                cohort_rows = 1;
                chunk_pref = w.chunk;
                break;
            }
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
        if w.media {
            break;
        }
    }
    let full = chunk_pref.unwrap_or(l.prefill_chunk).min(l.prefill_chunk).max(1);
    let chunk = if s.decoding == 0 {
        full
    } else {
        (l.step_budget / cohort_rows.max(1)).min(l.pace_cap).clamp(1, full)
    };
    let admit = match (from_cache, admit, s.cohort) {
        (Some(n), _, _) => Admit::FromCache(n),
        (None, 0, _) => Admit::Nothing,
        (None, n, Some(_)) => Admit::Join(n),
        (None, n, None) => Admit::NewCohort(n),
    };
    Plan { admit, chunk }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Limits = Limits { max_rows: 4, kv_budget: 1000, prefill_chunk: 2048, step_budget: 256, pace_cap: 1000 };

    fn w(len: usize, kv: usize) -> Waiting {
        Waiting { prompt_len: len, kv_need: kv, chunk: None, cached: 0, loading: false, media: false }
    }

    #[test]
    fn media_prompts_prefill_alone() {
        let m = Waiting { media: true, ..w(100, 10) };
        let st = |cohort, q: &[Waiting]| plan(&State { decoding: 2, cohort, waiting: q, kv_reserved: 0 }, &L).admit;
        assert_eq!(st(None, &[m, w(90, 10)]), Admit::NewCohort(1), "nothing joins a media prompt's new cohort");
        assert_eq!(st(None, &[w(90, 10), m]), Admit::NewCohort(1), "a media prompt joins no cohort");
        let running = Some(CohortView { rows: 1, remaining: 500, chunk: None, atomic: false });
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
    fn arrivals_join_a_running_cohort_when_they_fit() {
        let c = Some(CohortView { rows: 1, remaining: 50, chunk: None, atomic: false });
        let q = [w(40, 10), w(60, 10), w(10, 10)];
        let p = plan(&State { decoding: 0, cohort: c, waiting: &q, kv_reserved: 0 }, &L);
        assert_eq!(p, Plan { admit: Admit::Join(1), chunk: 2048 });
    }

    #[test]
    fn cached_prefixes_start_their_own_cohort_and_loads_block() {
        let hit = Waiting { cached: 64, ..w(100, 10) };
        let q = [hit, w(90, 10)];
        let p = plan(&State { decoding: 0, cohort: None, waiting: &q, kv_reserved: 0 }, &L);
        assert_eq!(p.admit, Admit::FromCache(64));
        let q = [w(90, 10), hit];
        assert_eq!(plan(&State { decoding: 0, cohort: None, waiting: &q, kv_reserved: 0 }, &L).admit, Admit::NewCohort(1));
        let c = Some(CohortView { rows: 1, remaining: 500, chunk: None, atomic: false });
        assert_eq!(plan(&State { decoding: 0, cohort: c, waiting: &[hit], kv_reserved: 0 }, &L).admit, Admit::Nothing);
        let q = [Waiting { loading: true, ..w(90, 10) }, w(10, 10)];
        assert_eq!(plan(&State { decoding: 0, cohort: None, waiting: &q, kv_reserved: 0 }, &L).admit, Admit::Nothing);
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
        let c = Some(CohortView { rows: 300, remaining: 10, chunk: None, atomic: false });
        let p = plan(&State { decoding: 2, cohort: c, waiting: &[], kv_reserved: 0 }, &L);
        assert_eq!(p, Plan { admit: Admit::Nothing, chunk: 1 });
    }
}
