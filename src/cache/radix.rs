//! A radix tree over token ids: finds, for a prompt, the cached sequence that
//! shares the longest prefix with it in O(prompt length), whatever the number
//! of entries.

use std::collections::HashMap;

struct Node {
    /// Tokens on the edge from the parent to this node.
    edge: Vec<u32>,
    children: HashMap<u32, usize>,
    entry: Option<u64>,
    parent: usize,
}

pub struct Radix {
    nodes: Vec<Option<Node>>,
    free: Vec<usize>,
}

const ROOT: usize = 0;

impl Default for Radix {
    fn default() -> Self {
        Radix { nodes: vec![Some(Node { edge: vec![], children: HashMap::new(), entry: None, parent: ROOT })], free: vec![] }
    }
}

impl Radix {
    fn node(&self, i: usize) -> &Node {
        self.nodes[i].as_ref().expect("live node")
    }

    fn node_mut(&mut self, i: usize) -> &mut Node {
        self.nodes[i].as_mut().expect("live node")
    }

    fn alloc(&mut self, n: Node) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.nodes[i] = Some(n);
                i
            }
            None => {
                self.nodes.push(Some(n));
                self.nodes.len() - 1
            }
        }
    }

    /// Associates `key` with `id`; returns the id it replaces.
    pub fn insert(&mut self, key: &[u32], id: u64) -> Option<u64> {
        let mut at = ROOT;
        let mut rest = key;
        loop {
            if rest.is_empty() {
                return self.node_mut(at).entry.replace(id);
            }
            let Some(&child) = self.node(at).children.get(&rest[0]) else {
                let leaf = self.alloc(Node { edge: rest.to_vec(), children: HashMap::new(), entry: Some(id), parent: at });
                self.node_mut(at).children.insert(rest[0], leaf);
                return None;
            };
            let common = common_len(&self.node(child).edge, rest);
            if common < self.node(child).edge.len() {
                // Split the edge: at -> mid (common part) -> child (the rest).
                let tail = self.node_mut(child).edge.split_off(common);
                let head = std::mem::take(&mut self.node_mut(child).edge);
                let mid = self.alloc(Node { edge: head, children: HashMap::new(), entry: None, parent: at });
                self.node_mut(mid).children.insert(tail[0], child);
                let c = self.node_mut(child);
                c.edge = tail;
                c.parent = mid;
                self.node_mut(at).children.insert(rest[0], mid);
                at = mid;
            } else {
                at = child;
            }
            rest = &rest[common..];
        }
    }

    /// The node holding exactly `key`, if any.
    fn exact(&self, key: &[u32]) -> Option<usize> {
        let (node, depth) = self.walk(key);
        (depth == key.len() && self.node_end(node) == key.len()).then_some(node)
    }

    /// The id associated with exactly `key`.
    pub fn get(&self, key: &[u32]) -> Option<u64> {
        self.node(self.exact(key)?).entry
    }

    /// Removes `key`'s association; returns its id.
    pub fn remove(&mut self, key: &[u32]) -> Option<u64> {
        let node = self.exact(key)?;
        let id = self.node_mut(node).entry.take()?;
        self.prune(node);
        Some(id)
    }

    /// Depth (tokens from the root) at the end of `node`'s edge.
    fn node_end(&self, mut node: usize) -> usize {
        let mut d = 0;
        while node != ROOT {
            d += self.node(node).edge.len();
            node = self.node(node).parent;
        }
        d
    }

    /// Drops empty leaves upwards.
    fn prune(&mut self, mut node: usize) {
        while node != ROOT {
            let n = self.node(node);
            if n.entry.is_some() || !n.children.is_empty() {
                return;
            }
            let (parent, first) = (n.parent, n.edge[0]);
            self.node_mut(parent).children.remove(&first);
            self.nodes[node] = None;
            self.free.push(node);
            node = parent;
        }
    }

    /// Follows `key` as far as it matches: the node whose edge the walk ended
    /// in (or at the end of) and the number of tokens matched.
    fn walk(&self, key: &[u32]) -> (usize, usize) {
        let mut at = ROOT;
        let mut depth = 0;
        loop {
            let rest = &key[depth..];
            let Some(&child) = rest.first().and_then(|t| self.node(at).children.get(t)) else {
                return (at, depth);
            };
            let edge = &self.node(child).edge;
            let common = common_len(edge, rest);
            depth += common;
            if common < edge.len() {
                return (child, depth);
            }
            at = child;
        }
    }

    /// The entry sharing the longest (non-empty) prefix with `key`: (shared
    /// tokens, id). Any entry below the point where the walk stops shares
    /// exactly the tokens walked; the most recently inserted one (largest id)
    /// is chosen.
    pub fn longest(&self, key: &[u32]) -> Option<(usize, u64)> {
        let (node, depth) = self.walk(key);
        if depth == 0 {
            return None;
        }
        self.newest_below(node).map(|id| (depth, id))
    }

    /// The longest entry that is a whole prefix of `key` (for state that
    /// cannot be cut back, only such entries are usable): (its length, id).
    pub fn longest_whole(&self, key: &[u32]) -> Option<(usize, u64)> {
        let mut at = ROOT;
        let mut depth = 0;
        let mut best = None;
        loop {
            let rest = &key[depth..];
            let Some(&child) = rest.first().and_then(|t| self.node(at).children.get(t)) else {
                return best;
            };
            let edge = &self.node(child).edge;
            if common_len(edge, rest) < edge.len() {
                return best;
            }
            depth += edge.len();
            at = child;
            if let Some(id) = self.node(at).entry {
                best = Some((depth, id));
            }
        }
    }

    fn newest_below(&self, node: usize) -> Option<u64> {
        let n = self.node(node);
        n.children.values().filter_map(|&c| self.newest_below(c)).chain(n.entry).max()
    }
}

fn common_len(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_shared_prefix() {
        let mut r = Radix::default();
        assert_eq!(r.longest(&[1, 2, 3]), None);
        r.insert(&[1, 2, 3, 4, 5], 10);
        r.insert(&[1, 2, 9], 11);
        r.insert(&[7, 7], 12);
        assert_eq!(r.longest(&[1, 2, 3, 4, 5, 6]), Some((5, 10)));
        assert_eq!(r.longest(&[1, 2, 3, 8]), Some((3, 10)), "diverges inside an edge");
        assert_eq!(r.longest(&[1, 2, 9, 9]), Some((3, 11)));
        assert_eq!(r.longest(&[1, 2]), Some((2, 11)), "newest entry below");
        assert_eq!(r.longest(&[5]), None);
        assert_eq!(r.longest(&[7]), Some((1, 12)));
    }

    #[test]
    fn longest_whole_entry() {
        let mut r = Radix::default();
        r.insert(&[1, 2, 3, 4, 5], 10);
        r.insert(&[1, 2], 11);
        r.insert(&[1, 2, 9], 12);
        assert_eq!(r.longest_whole(&[1, 2, 3, 4, 5, 6]), Some((5, 10)));
        assert_eq!(r.longest_whole(&[1, 2, 3, 4]), Some((2, 11)), "not a partial entry");
        assert_eq!(r.longest_whole(&[1, 2, 9]), Some((3, 12)));
        assert_eq!(r.longest_whole(&[1]), None);
        assert_eq!(r.longest_whole(&[]), None);
    }

    #[test]
    fn replace_remove_and_prune() {
        let mut r = Radix::default();
        r.insert(&[1, 2, 3], 1);
        assert_eq!(r.insert(&[1, 2, 3], 2), Some(1));
        r.insert(&[1, 2], 3);
        assert_eq!(r.remove(&[1, 2, 3]), Some(2));
        assert_eq!(r.remove(&[1, 2, 3]), None);
        assert_eq!(r.longest(&[1, 2, 3]), Some((2, 3)));
        assert_eq!(r.remove(&[1]), None, "not a key");
        assert_eq!((r.get(&[1, 2]), r.get(&[1])), (Some(3), None));
        assert_eq!(r.remove(&[1, 2]), Some(3));
        assert_eq!(r.longest(&[1, 2, 3]), None);
        assert_eq!(r.nodes.iter().filter(|n| n.is_some()).count(), 1, "only the root is left");
    }

    #[test]
    fn many_keys() {
        let mut r = Radix::default();
        for i in 0..200u32 {
            let key: Vec<u32> = (0..(i % 17 + 1)).map(|j| (i * 7 + j) % 5).collect();
            r.insert(&key, i as u64);
        }
        for i in 0..200u32 {
            let key: Vec<u32> = (0..(i % 17 + 1)).map(|j| (i * 7 + j) % 5).collect();
            let (d, _) = r.longest(&key).unwrap();
            assert_eq!(d, key.len());
        }
    }
}
