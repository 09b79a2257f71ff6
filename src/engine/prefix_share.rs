//! Concurrent prefix sharing (`kv_paging`): requests that arrive together
//! with a common prompt prefix (a shared system prompt) share its full KV
//! blocks, with or without a prompt cache.
//!
//! A queued request whose prompt has at least one more full block in common
//! with a row ahead of it (prefilling now, or earlier in the queue) than it
//! could map now waits. When that row's prefill is over its prompt is kept
//! here (block references, no copy), and the waiting requests start from it
//! as from a prompt-cache hit, together in one cohort, each from all the
//! tokens it shares (the cohort keeps each row's end). An entry lives only while a queued request can
//! use it, so once the queue is empty nothing here holds a block.

use super::prompt_cache::Snapshot;
use crate::cache::LayerCache;
use crate::error::Result;

/// A queued request as sharing sees it: its namespace, cache key (prompt
/// ids) and the prefix the prompt cache holds for it.
pub(crate) struct Asker<'a> {
    pub namespace: &'a str,
    pub key: &'a [u32],
    pub cached: usize,
}

/// What a queued request does about sharing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Share {
    /// Wait: a row ahead of it will hold more of its prefix.
    pub wait: bool,
    /// An entry (index) and the leading tokens of the prompt it holds,
    /// when that is at least a block and more than the prompt cache gives.
    pub from: Option<(usize, usize)>,
}

struct Prefix {
    namespace: String,
    key: Vec<u32>,
    snapshot: Snapshot,
}

/// The prompts of rows whose prefill ended while requests sharing their
/// prefix were queued.
#[derive(Default)]
pub(crate) struct SharedPrefixes {
    entries: Vec<Prefix>,
}

/// Leading tokens of `key` that a row with prompt `lead` holds (all but the
/// last token of a prompt can come from elsewhere).
pub(crate) fn usable(key: &[u32], lead: &[u32]) -> usize {
    let common = key.iter().zip(lead).take_while(|(a, b)| a == b).count();
    common.min(key.len().saturating_sub(1))
}

impl SharedPrefixes {
    /// The sharing of queued requests (in queue order; None: one that does
    /// not use the cache), given the rows prefilling now (namespace, key) and
    /// blocks of `block` positions. A request that does not wait leads those
    /// behind it.
    pub fn plan(&self, block: usize, prefilling: &[(&str, &[u32])], queued: &[Option<Asker>]) -> Vec<Share> {
        let mut leaders: Vec<(&str, &[u32])> = prefilling.to_vec();
        let mut out = Vec::with_capacity(queued.len());
        for q in queued {
            let Some(q) = q else {
                out.push(Share::default());
                continue;
            };
            let from = (self.entries.iter().enumerate())
                .filter(|(_, e)| e.namespace == q.namespace)
                .map(|(i, e)| (i, usable(q.key, &e.key)))
                .max_by_key(|&(_, n)| n)
                .filter(|&(_, n)| n >= block && n > q.cached);
            let have = from.map_or(0, |f| f.1).max(q.cached);
            let later = (leaders.iter())
                .filter(|(ns, _)| *ns == q.namespace)
                .map(|(_, lead)| usable(q.key, lead))
                .max()
                .unwrap_or(0);
            let wait = later / block > have / block;
            if !wait {
                leaders.push((q.namespace, q.key));
            }
            out.push(Share { wait, from: if wait { None } else { from } });
        }
        out
    }

    /// Whether a queued request would map at least one full block of a row
    /// with this prompt.
    pub fn wanted(block: usize, namespace: &str, key: &[u32], queued: &[Option<Asker>]) -> bool {
        queued.iter().flatten().any(|q| q.namespace == namespace && usable(q.key, key) >= block)
    }

    /// Keeps a finished prefill's prompt for the requests that wait for it.
    pub fn add(&mut self, namespace: &str, key: &[u32], snapshot: Snapshot) {
        self.entries.push(Prefix { namespace: namespace.to_string(), key: key.to_vec(), snapshot });
    }

    /// One-row caches holding entry `i`'s first `n` positions (sharing its
    /// blocks).
    pub fn caches(&self, i: usize, n: usize) -> Result<Vec<LayerCache>> {
        self.entries[i].snapshot.caches(n as i32)
    }

    /// Drops the entries no queued request can map a full block of.
    pub fn prune(&mut self, block: usize, queued: &[Option<Asker>]) {
        self.entries.retain(|e| Self::wanted(block, &e.namespace, &e.key, queued));
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask<'a>(key: &'a [u32], cached: usize) -> Option<Asker<'a>> {
        Some(Asker { namespace: "", key, cached })
    }

    #[test]
    fn requests_wait_for_a_row_ahead_that_holds_more_blocks() {
        let s = SharedPrefixes::default();
        let a: Vec<u32> = (0..100).collect();
        let mut b = a.clone();
        b[70] = 999; // 70 tokens in common: 2 blocks of 32
        let mut c = a.clone();
        c[20] = 999; // less than a block
        let plan = s.plan(32, &[], &[ask(&a, 0), ask(&b, 0), ask(&c, 0)]);
        let waits: Vec<bool> = plan.iter().map(|p| p.wait).collect();
        assert_eq!(waits, [false, true, false], "b waits for a; c shares no block");
        // A prompt cache hit of as many blocks: nothing to wait for.
        assert!(!s.plan(32, &[("", &a)], &[ask(&b, 64)])[0].wait);
        // Another namespace shares nothing.
        let other = [Some(Asker { namespace: "x", key: &b, cached: 0 })];
        assert!(!s.plan(32, &[("", &a)], &other)[0].wait);
        // A request that does not use the cache neither waits nor leads.
        assert_eq!(s.plan(32, &[], &[None, ask(&b, 0)]), vec![Share::default(); 2]);
    }

    #[test]
    fn usable_stops_before_the_last_token() {
        assert_eq!(usable(&[1, 2, 3], &[1, 2, 3, 4]), 2);
        assert_eq!(usable(&[1, 2, 3], &[1, 9]), 1);
        assert_eq!(usable(&[], &[1]), 0);
    }
}
