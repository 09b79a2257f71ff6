//! Tower outputs of recent images, keyed by content hash (decoded pixels +
//! processing parameters, `media::process::content_hash`), so a repeated
//! image skips the vision tower. Least recently used entries go first when
//! the byte budget is exceeded. Scheduler thread only (holds MLX arrays).

use crate::model::Encoded;
use std::collections::HashMap;

pub(crate) struct EncoderCache {
    entries: HashMap<[u8; 32], (Encoded, u64)>,
    budget: usize,
    bytes: usize,
    tick: u64,
}

impl EncoderCache {
    pub fn new(budget: usize) -> EncoderCache {
        EncoderCache { entries: HashMap::new(), budget, bytes: 0, tick: 0 }
    }

    /// The cached rows of `key` (shared, not copied), marking them used.
    pub fn get(&mut self, key: &[u8; 32]) -> Option<Encoded> {
        self.tick += 1;
        let tick = self.tick;
        self.entries.get_mut(key).map(|(a, used)| {
            *used = tick;
            a.share()
        })
    }

    /// Bytes of tower output held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Images held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Keeps `rows` (evaluated) under `key`, evicting least recently used
    /// entries beyond the budget; an entry larger than the budget is not kept.
    pub fn put(&mut self, key: [u8; 32], rows: Encoded) {
        let n = rows.nbytes();
        if n > self.budget {
            return;
        }
        self.tick += 1;
        if let Some((old, _)) = self.entries.insert(key, (rows, self.tick)) {
            self.bytes -= old.nbytes();
        }
        self.bytes += n;
        while self.bytes > self.budget {
            let oldest = *self.entries.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| k).expect("over budget means not empty");
            let (a, _) = self.entries.remove(&oldest).expect("found above");
            self.bytes -= a.nbytes();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlx::Array;

    #[test]
    fn least_recently_used_goes_first() {
        let rows = || Encoded { rows: Array::from_f32(&[0.0; 4], &[1, 4]).unwrap(), deepstack: vec![] }; // 16 bytes
        let mut c = EncoderCache::new(40);
        c.put([1; 32], rows());
        c.put([2; 32], rows());
        assert!(c.get(&[1; 32]).is_some());
        c.put([3; 32], rows()); // 48 > 40: evicts 2, the least recently used
        assert!(c.get(&[2; 32]).is_none());
        assert!(c.get(&[1; 32]).is_some() && c.get(&[3; 32]).is_some());
        assert_eq!((c.bytes(), c.len()), (32, 2));
        let mut none = EncoderCache::new(0);
        none.put([1; 32], rows());
        assert!(none.get(&[1; 32]).is_none(), "budget 0 keeps nothing");
    }
}
