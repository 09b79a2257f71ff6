//! The in-memory prompt cache: snapshots of prompt KV state keyed by their
//! token ids, per namespace (tenants never share state), under a byte budget
//! with least-recently-used eviction. Generic over the stored value so the
//! policy is testable without MLX.

use super::radix::Radix;
use std::collections::{BTreeMap, HashMap};

/// Something with a size.
pub trait Sized {
    fn nbytes(&self) -> usize;
}

struct Stored<E> {
    namespace: String,
    tokens: Vec<u32>,
    value: E,
    tick: u64,
}

/// An entry that left the cache (evicted or drained), for the disk tier.
pub struct Evicted<E> {
    pub namespace: String,
    pub tokens: Vec<u32>,
    pub value: E,
}

pub struct PrefixCache<E> {
    trees: HashMap<String, Radix>,
    entries: HashMap<u64, Stored<E>>,
    /// Last use → entry id (oldest first).
    lru: BTreeMap<u64, u64>,
    bytes: usize,
    budget: usize,
    tick: u64,
    next_id: u64,
}

/// A lookup result: how many leading prompt tokens the entry covers.
pub struct Hit<'a, E> {
    pub tokens: usize,
    pub value: &'a E,
}

impl<E: Sized> PrefixCache<E> {
    pub fn new(budget: usize) -> PrefixCache<E> {
        PrefixCache {
            trees: HashMap::new(),
            entries: HashMap::new(),
            lru: BTreeMap::new(),
            bytes: 0,
            budget,
            tick: 0,
            next_id: 1,
        }
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn touch(&mut self, id: u64) {
        self.tick += 1;
        let e = self.entries.get_mut(&id).expect("live entry");
        self.lru.remove(&e.tick);
        e.tick = self.tick;
        self.lru.insert(self.tick, id);
    }

    /// The entry sharing the longest prefix with `prompt` in `namespace`
    /// (marked as used).
    pub fn lookup(&mut self, namespace: &str, prompt: &[u32]) -> Option<Hit<'_, E>> {
        let (tokens, id) = self.trees.get(namespace)?.longest(prompt)?;
        self.touch(id);
        Some(Hit { tokens, value: &self.entries[&id].value })
    }

    /// The longest entry in `namespace` that is a whole prefix of `prompt`
    /// (marked as used): for state that cannot be cut back.
    pub fn lookup_whole(&mut self, namespace: &str, prompt: &[u32]) -> Option<Hit<'_, E>> {
        let (tokens, id) = self.trees.get(namespace)?.longest_whole(prompt)?;
        self.touch(id);
        Some(Hit { tokens, value: &self.entries[&id].value })
    }

    /// Whether `namespace` holds exactly `tokens`.
    pub fn contains(&self, namespace: &str, tokens: &[u32]) -> bool {
        self.trees.get(namespace).and_then(|t| t.get(tokens)).is_some()
    }

    /// Adds (or replaces) an entry; returns what had to be evicted to stay
    /// within the budget, oldest first. An entry larger than the whole budget
    /// is returned at once.
    pub fn insert(&mut self, namespace: &str, tokens: Vec<u32>, value: E) -> Vec<Evicted<E>> {
        if value.nbytes() > self.budget {
            return vec![Evicted { namespace: namespace.to_string(), tokens, value }];
        }
        let id = self.next_id;
        self.next_id += 1;
        let tree = self.trees.entry(namespace.to_string()).or_default();
        if let Some(old) = tree.insert(&tokens, id) {
            self.drop_entry(old);
        }
        self.bytes += value.nbytes();
        self.entries.insert(id, Stored { namespace: namespace.to_string(), tokens, value, tick: 0 });
        self.touch(id);
        let mut out = vec![];
        while self.bytes > self.budget {
            let (_, &oldest) = self.lru.iter().next().expect("over budget means non-empty");
            out.push(self.remove_id(oldest));
        }
        out
    }

    fn drop_entry(&mut self, id: u64) {
        if let Some(e) = self.entries.remove(&id) {
            self.lru.remove(&e.tick);
            self.bytes -= e.value.nbytes();
        }
    }

    fn remove_id(&mut self, id: u64) -> Evicted<E> {
        let e = self.entries.remove(&id).expect("live entry");
        self.lru.remove(&e.tick);
        self.bytes -= e.value.nbytes();
        if let Some(tree) = self.trees.get_mut(&e.namespace) {
            tree.remove(&e.tokens);
        }
        Evicted { namespace: e.namespace, tokens: e.tokens, value: e.value }
    }

    /// Visits every entry.
    pub fn for_each_mut(&mut self, mut f: impl FnMut(&str, &[u32], &mut E)) {
        for e in self.entries.values_mut() {
            f(&e.namespace, &e.tokens, &mut e.value);
        }
    }

    /// Removes every entry (oldest first), e.g. to write them to disk.
    pub fn drain(&mut self) -> Vec<Evicted<E>> {
        let ids: Vec<u64> = self.lru.values().copied().collect();
        let out = ids.into_iter().map(|id| self.remove_id(id)).collect();
        self.trees.clear();
        out
    }

    /// Entries not used for the last `older_than` lookups or insertions.
    pub fn drain_idle(&mut self, older_than: u64) -> Vec<Evicted<E>> {
        let cutoff = self.tick.saturating_sub(older_than);
        let ids: Vec<u64> = self.lru.range(..cutoff).map(|(_, &id)| id).collect();
        ids.into_iter().map(|id| self.remove_id(id)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct B(usize);
    impl Sized for B {
        fn nbytes(&self) -> usize {
            self.0
        }
    }

    #[test]
    fn hits_misses_and_partial_prefixes() {
        let mut c = PrefixCache::new(1000);
        assert!(c.lookup("", &[1, 2, 3]).is_none());
        c.insert("", vec![1, 2, 3, 4], B(10));
        assert_eq!(c.lookup("", &[1, 2, 3, 4, 5]).unwrap().tokens, 4);
        assert_eq!(c.lookup("", &[1, 2, 7]).unwrap().tokens, 2);
        assert!(c.lookup("", &[9]).is_none());
        assert!(c.contains("", &[1, 2, 3, 4]) && !c.contains("", &[1, 2, 3]));
        c.insert("", vec![1, 2, 3, 4, 5], B(10));
        assert!(c.contains("", &[1, 2, 3, 4]), "an exact entry under a longer one");
    }

    #[test]
    fn namespaces_are_isolated() {
        let mut c = PrefixCache::new(1000);
        c.insert("alice", vec![1, 2, 3], B(10));
        assert!(c.lookup("bob", &[1, 2, 3]).is_none());
        assert!(c.lookup("", &[1, 2, 3]).is_none());
        assert_eq!(c.lookup("alice", &[1, 2, 3]).unwrap().tokens, 3);
    }

    #[test]
    fn lru_eviction_under_budget() {
        let mut c = PrefixCache::new(100);
        assert!(c.insert("", vec![1], B(40)).is_empty());
        assert!(c.insert("", vec![2], B(40)).is_empty());
        c.lookup("", &[1]); // 1 is now the most recent
        let ev = c.insert("", vec![3], B(40));
        assert_eq!(ev.iter().map(|e| e.tokens.clone()).collect::<Vec<_>>(), vec![vec![2]]);
        assert_eq!(c.bytes(), 80);
        assert!(c.lookup("", &[2]).is_none());
        let big = c.insert("", vec![4], B(500));
        assert_eq!(big.len(), 1, "larger than the budget: not kept");
        assert_eq!((c.len(), c.bytes()), (2, 80));
    }

    #[test]
    fn replace_and_drain() {
        let mut c = PrefixCache::new(100);
        c.insert("", vec![1, 2], B(30));
        c.insert("", vec![1, 2], B(20));
        assert_eq!((c.len(), c.bytes()), (1, 20));
        c.insert("x", vec![5], B(5));
        let all = c.drain();
        assert_eq!(all.len(), 2);
        assert_eq!((c.len(), c.bytes()), (0, 0));
        assert!(c.lookup("", &[1, 2]).is_none());
    }
}
