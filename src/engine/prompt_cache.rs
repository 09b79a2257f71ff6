//! The prompt cache as the scheduler uses it: snapshots of prompt KV state
//! in memory (`cache::prefix`), spilled to and restored from the cache
//! directory (`cache::store`) through the file thread (`cache_io`).
//!
//! Snapshots are taken at a stable prompt boundary (the conversation before
//! its last message; for other prompts, all but the last token, which an
//! identical prompt reuses) once prefill is done, and of the whole sequence
//! when a request ends, so the next turn of a conversation reuses the reply
//! too.
//! Memory entries go to disk when evicted, when the engine has been idle for
//! a moment, on flush, and at shutdown.

use super::cache_io::{self, IoDone, IoJob};
use super::log::{LogLevel, Logger};
use super::scheduler::Command;
use crate::cache::paged::codec::{self, PagedMeta};
use crate::cache::paged::{PagedLayer, PagedPools};
use crate::cache::prefix::{self, PrefixCache};
use crate::cache::scheme::KvLayer;
use crate::cache::store::{DiskIndex, EntryFile, Tensor};
use crate::cache::{LayerCache, LayerSnapshot};
use crate::error::{Error, Result};
use crate::mlx::{self, Array};
use crossbeam_channel::Sender;
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Cache state of positions `0..len` of a sequence, one part per layer (KV,
/// or a recurrent state valid at exactly `len`).
pub(crate) struct Snapshot {
    layers: Vec<LayerSnapshot>,
    bytes: usize,
    /// Whether an identical file is on disk already.
    persisted: bool,
}

impl prefix::Sized for Snapshot {
    fn nbytes(&self) -> usize {
        self.bytes
    }
}

impl Snapshot {
    /// Row `row`'s positions `0..len` of a batch's per-layer caches
    /// (`shared`: of caches about to be dropped, see `snapshot_row`).
    pub fn of_row(cache: &[LayerCache], row: usize, len: i32, shared: bool) -> Result<Snapshot> {
        let layers = cache.iter().map(|c| c.snapshot_row(row, len, shared)).collect::<Result<Vec<_>>>()?;
        let arrays: Vec<&Array> = layers.iter().flat_map(|l| l.tensors().into_iter().map(|(_, a)| a)).collect();
        mlx::async_eval(&arrays)?;
        let bytes = layers.iter().map(LayerSnapshot::nbytes).sum();
        Ok(Snapshot { layers, bytes, persisted: false })
    }

    /// Per-layer one-row caches holding the first `n` positions.
    pub fn caches(&self, n: i32) -> Result<Vec<LayerCache>> {
        self.layers.iter().map(|l| l.restore(n)).collect()
    }

    fn to_entry(&self, namespace: &str, tokens: &[u32]) -> Result<EntryFile> {
        let mut tensors = vec![];
        let mut meta = BTreeMap::new();
        let mut add = |name: String, a: &Array| -> Result<()> {
            tensors.push(Tensor { name, dtype: a.dtype(), shape: a.shape(), data: a.to_bytes()? });
            Ok(())
        };
        for (i, l) in self.layers.iter().enumerate() {
            match l {
                // A paged layer: its blocks and their layout.
                LayerSnapshot::Paged(p) => {
                    let (layout, planes) = codec::encode(p)?;
                    for (k, a) in planes.iter().enumerate() {
                        add(format!("{i}.p.{k}"), a)?;
                    }
                    meta.insert(format!("paged.{i}"), layout.to_json());
                }
                l => {
                    for (name, a) in l.tensors() {
                        add(format!("{i}.{name}"), a)?;
                    }
                }
            }
        }
        Ok(EntryFile { namespace: namespace.to_string(), tokens: tokens.to_vec(), tensors, meta })
    }

    /// Rebuilds a snapshot from a file for a model of `layers` layer caches
    /// (`paged`: the engine's pools, into which paged layers are loaded).
    /// Every layer is checked before a block is taken; a failure after that
    /// drops the blocks taken, so none is lost.
    fn from_entry(e: &EntryFile, layers: usize, paged: Option<&PagedSetup>) -> std::result::Result<Snapshot, String> {
        let tensor = |name: &str| e.tensors.iter().find(|t| t.name == name);
        let mut parts = vec![];
        for i in 0..layers {
            let pool = paged.and_then(|p| Some((p.pools.layers.get(i)?.as_ref()?, p.layers.get(i).copied().flatten()?)));
            let part = match (pool, e.meta.get(&format!("paged.{i}"))) {
                (Some((layer, kv)), Some(json)) => (|| -> std::result::Result<Part, String> {
                    let meta = PagedMeta::parse(json)?;
                    let planes = (0..meta.tensors(layer))
                        .map(|k| tensor(&format!("{i}.p.{k}")).ok_or(format!("no tensor {i}.p.{k}")))
                        .collect::<std::result::Result<Vec<_>, String>>()?;
                    let dims: Vec<_> = planes.iter().map(|t| (t.dtype, t.shape.as_slice())).collect();
                    codec::check(&meta, &dims, layer, &kv, e.tokens.len())?;
                    Ok(Part::Paged { layer, meta, planes })
                })(),
                (Some(_), None) => Err("paged here, the file holds it unpaged".to_string()),
                (None, Some(_)) => Err("stored paged, this engine does not page it".to_string()),
                (None, None) => {
                    let get = |name: &str| -> std::result::Result<Option<Array>, String> {
                        match tensor(&format!("{i}.{name}")) {
                            None => Ok(None),
                            Some(t) => Array::from_bytes(&t.data, &t.shape, t.dtype).map(Some).map_err(|e| e.to_string()),
                        }
                    };
                    LayerSnapshot::from_tensors(e.tokens.len() as i32, get).map(Part::Ready)
                }
            };
            parts.push(part.map_err(|why| format!("layer {i}: {why}"))?);
        }
        let stored: usize = parts
            .iter()
            .map(|p| match p {
                Part::Ready(l) => l.tensors().len(),
                Part::Paged { planes, .. } => planes.len(),
            })
            .sum();
        let paged_layers = parts.iter().filter(|p| matches!(p, Part::Paged { .. })).count();
        if e.tensors.len() != stored || e.meta.len() != paged_layers {
            return Err(format!("{} tensors and {} layouts for a model of {layers} layer caches", e.tensors.len(), e.meta.len()));
        }
        // Checked: now the paged layers go into fresh blocks.
        let mut pools = vec![];
        let layers = parts
            .into_iter()
            .map(|p| match p {
                Part::Ready(l) => Ok(l),
                Part::Paged { layer, meta, planes } => {
                    let arrays = planes.iter().map(|t| Array::from_bytes(&t.data, &t.shape, t.dtype)).collect::<mlx::Result<Vec<_>>>()?;
                    pools.extend(std::iter::once(&layer.pool).chain(&layer.float));
                    Ok(LayerSnapshot::Paged(codec::load(&meta, arrays, layer)?))
                }
            })
            .collect::<Result<Vec<_>>>()
            .map_err(|e| e.to_string())?;
        // The writes are done here, so that an MLX error shows now (the
        // entry's blocks go back) and not in a later step.
        let mut state = vec![];
        for p in pools {
            state.extend(p.borrow().planes().iter().map(Array::share));
        }
        mlx::eval(&state.iter().collect::<Vec<_>>()).map_err(|e| e.to_string())?;
        let bytes = layers.iter().map(LayerSnapshot::nbytes).sum();
        Ok(Snapshot { layers, bytes, persisted: true })
    }
}

/// One layer of an entry file being loaded: rebuilt, or a paged layer
/// checked and waiting for its blocks.
enum Part<'a> {
    Ready(LayerSnapshot),
    Paged { layer: &'a PagedLayer, meta: PagedMeta, planes: Vec<&'a Tensor> },
}

/// What loading paged layers needs: the engine's pools and the model's
/// layer shapes (`LanguageModel::kv_layers`).
pub(crate) struct PagedSetup {
    pub pools: PagedPools,
    pub layers: Vec<Option<KvLayer>>,
}

fn persist_to(io: Option<&Sender<IoJob>>, log: &Logger, namespace: &str, tokens: &[u32], snap: &Snapshot) {
    let Some(io) = io else { return };
    if snap.persisted {
        return;
    }
    match snap.to_entry(namespace, tokens) {
        Ok(entry) => {
            let _ = io.send(IoJob::Write { entry });
        }
        Err(e) => log.log(LogLevel::Warn, format!("prompt cache: cannot save an entry: {e}")),
    }
}

/// Counters shared with the engine handle.
#[derive(Debug, Default)]
pub(crate) struct CacheStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub hit_tokens: AtomicU64,
    pub memory_bytes: AtomicUsize,
    pub disk_bytes: AtomicU64,
}

/// A snapshot for the prompt cache: `snapshot` holds the first
/// `tokens.len()` positions of a sequence in `namespace`.
pub(crate) struct Capture {
    pub namespace: String,
    pub tokens: Vec<u32>,
    pub snapshot: Snapshot,
}

/// What a lookup found for a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// Leading prompt tokens available in memory.
    Hit(usize),
    /// A longer prefix is being read from disk: wait for it.
    Loading,
    Miss,
}

pub(crate) struct PromptCache {
    mem: PrefixCache<Snapshot>,
    disk: Option<DiskIndex>,
    io: Option<(Sender<IoJob>, std::thread::JoinHandle<()>)>,
    loading: HashSet<PathBuf>,
    min_tokens: usize,
    layers: usize,
    /// Admitted requests that started from a cached prefix, those that did
    /// not, and the prompt tokens the hits supplied.
    hits: u64,
    misses: u64,
    hit_tokens: u64,
    /// Entries are only usable whole (the model has recurrent layers, whose
    /// state cannot be cut back to a shorter prefix).
    whole_only: bool,
    /// With `kv_paging`: where entry files' paged layers are loaded.
    paged: Option<PagedSetup>,
    log: Logger,
}

/// The settings the prompt cache needs.
pub(crate) struct CacheSetup {
    pub memory_bytes: usize,
    pub dir: Option<PathBuf>,
    pub dir_bytes: u64,
    pub min_tokens: usize,
    pub compat: String,
    /// Layer caches per sequence (`LanguageModel::new_cache(1).len()`).
    pub layers: usize,
    /// Whether every layer cache can be cut back (`LayerCache::trimmable`).
    pub trimmable: bool,
    pub paged: Option<PagedSetup>,
}

impl PromptCache {
    pub fn new(s: CacheSetup, log: Logger, commands: Sender<Command>) -> Result<PromptCache> {
        let (disk, io) = match &s.dir {
            None => (None, None),
            Some(dir) => {
                let l = log.clone();
                let idx = DiskIndex::open(dir, s.dir_bytes, &s.compat, &|m| l.log(LogLevel::Warn, m))
                    .map_err(|e| Error::new(crate::ErrorKind::Io, format!("prompt cache directory {}: {e}", dir.display())))?;
                log.log(LogLevel::Info, format!("prompt cache: {} entries ({} bytes) in {}", idx.len(), idx.bytes(), dir.display()));
                let io = cache_io::spawn(dir.clone(), s.compat.clone(), commands)
                    .map_err(|e| Error::internal(format!("cannot start the cache file thread: {e}")))?;
                (Some(idx), Some(io))
            }
        };
        Ok(PromptCache {
            mem: PrefixCache::new(s.memory_bytes),
            disk,
            io,
            loading: HashSet::new(),
            min_tokens: s.min_tokens,
            layers: s.layers,
            hits: 0,
            misses: 0,
            hit_tokens: 0,
            whole_only: !s.trimmable,
            paged: s.paged,
            log,
        })
    }

    /// How much of `prompt` a cache can supply (at most all but its last
    /// token, which must be forwarded to produce logits). A longer prefix on
    /// disk is requested and reported as `Loading`.
    /// For a model with recurrent layers only an entry that is a whole
    /// prefix of the prompt (without its last token) counts.
    pub fn lookup(&mut self, namespace: &str, prompt: &[u32]) -> Found {
        let usable = |n: usize| n.min(prompt.len().saturating_sub(1));
        let body = &prompt[..prompt.len().saturating_sub(1)];
        let in_mem = if self.whole_only {
            self.mem.lookup_whole(namespace, body).map_or(0, |h| h.tokens)
        } else {
            self.mem.lookup(namespace, prompt).map_or(0, |h| usable(h.tokens))
        };
        if let Some(disk) = &mut self.disk {
            let on_disk = if self.whole_only { disk.lookup_whole(namespace, body) } else { disk.lookup(namespace, prompt) };
            if let Some((n, path)) = on_disk {
                if usable(n) > in_mem && usable(n) >= self.min_tokens.min(prompt.len().saturating_sub(1)).max(1) {
                    if self.loading.insert(path.clone()) {
                        if let Some((io, _)) = &self.io {
                            let _ = io.send(IoJob::Read { path });
                        }
                    }
                    return Found::Loading;
                }
            }
        }
        if in_mem > 0 {
            Found::Hit(in_mem)
        } else {
            Found::Miss
        }
    }

    /// Starts an admitted request from a hit `lookup` found: caches for the
    /// first `n` tokens of `prompt`, counted as a hit; None, counted as a
    /// miss, when the entry was evicted since the lookup.
    pub fn claim(&mut self, namespace: &str, prompt: &[u32], n: usize) -> Result<Option<Vec<LayerCache>>> {
        let hit = if self.whole_only {
            self.mem.lookup_whole(namespace, &prompt[..n])
        } else {
            self.mem.lookup(namespace, prompt).filter(|h| h.tokens >= n)
        };
        let Some(hit) = hit else {
            self.misses += 1;
            return Ok(None);
        };
        let caches = hit.value.caches(n as i32)?;
        self.hits += 1;
        self.hit_tokens += n as u64;
        Ok(Some(caches))
    }

    /// Counts an admitted request that uses the cache but starts without a
    /// cached prefix.
    pub fn miss(&mut self) {
        self.misses += 1;
    }

    /// Whether a snapshot of `tokens` would be kept (long enough, not held
    /// already): steps offer snapshots, and only these are taken.
    pub fn wants(&self, namespace: &str, tokens: &[u32]) -> bool {
        self.wants_len(tokens.len()) && !self.mem.contains(namespace, tokens)
    }

    /// Whether a hit may cut an entry back to a shorter prefix (every layer
    /// is trimmable): then any prefix of a held entry is served.
    pub fn trims(&self) -> bool {
        !self.whole_only
    }

    /// Whether a snapshot of `n` tokens is long enough to keep.
    pub fn wants_len(&self, n: usize) -> bool {
        n >= self.min_tokens
    }

    /// Adds a snapshot (spilling what it evicts to disk).
    pub fn capture(&mut self, c: Capture) {
        if !self.wants(&c.namespace, &c.tokens) {
            return;
        }
        for e in self.mem.insert(&c.namespace, c.tokens, c.snapshot) {
            self.persist(&e.namespace, &e.tokens, &e.value);
        }
    }

    /// Sends a snapshot to disk unless it is there already.
    fn persist(&self, namespace: &str, tokens: &[u32], snap: &Snapshot) {
        persist_to(self.io.as_ref().map(|(tx, _)| tx), &self.log, namespace, tokens, snap);
    }

    /// Writes every memory entry not on disk yet (they stay in memory).
    pub fn persist_all(&mut self) {
        let io = self.io.as_ref().map(|(tx, _)| tx.clone());
        let log = self.log.clone();
        self.mem.for_each_mut(|ns, tokens, snap| {
            persist_to(io.as_ref(), &log, ns, tokens, snap);
            snap.persisted = true;
        });
    }

    /// Blocks until the file thread has done everything asked so far.
    pub fn sync(&self) {
        if let Some((io, _)) = &self.io {
            let (tx, rx) = crossbeam_channel::bounded(1);
            if io.send(IoJob::Barrier(tx)).is_ok() {
                let _ = rx.recv();
            }
        }
    }

    /// Drops memory entries, and the files too when `disk` is set.
    pub fn clear(&mut self, disk: bool) {
        self.mem.drain();
        if disk {
            if let (Some(idx), Some((io, _))) = (&mut self.disk, &self.io) {
                let _ = io.send(IoJob::Delete(idx.clear()));
            }
        }
    }

    /// A file-thread result.
    pub fn on_io(&mut self, done: IoDone) {
        match done {
            IoDone::Written { namespace, tokens, result } => match (result, &mut self.disk) {
                (Ok((path, bytes)), Some(idx)) => {
                    let gone = idx.added(namespace, tokens, path, bytes);
                    if !gone.is_empty() {
                        if let Some((io, _)) = &self.io {
                            let _ = io.send(IoJob::Delete(gone));
                        }
                    }
                }
                (Err(e), _) => self.log.log(LogLevel::Warn, format!("prompt cache: writing an entry failed: {e}")),
                _ => {}
            },
            IoDone::Loaded { path, result } => {
                self.loading.remove(&path);
                match result.and_then(|e| Snapshot::from_entry(&e, self.layers, self.paged.as_ref()).map(|s| (e, s))) {
                    Ok((e, snap)) => {
                        for ev in self.mem.insert(&e.namespace, e.tokens, snap) {
                            self.persist(&ev.namespace, &ev.tokens, &ev.value);
                        }
                    }
                    Err(why) => {
                        self.log.log(LogLevel::Warn, format!("prompt cache: not loading {}: {why}", path.display()));
                        if let Some(idx) = &mut self.disk {
                            if let (Some(p), Some((io, _))) = (idx.remove_path(&path), &self.io) {
                                let _ = io.send(IoJob::Delete(vec![p]));
                            }
                        }
                    }
                }
            }
        }
    }

    pub fn publish(&self, s: &CacheStats) {
        s.hits.store(self.hits, Ordering::Relaxed);
        s.misses.store(self.misses, Ordering::Relaxed);
        s.hit_tokens.store(self.hit_tokens, Ordering::Relaxed);
        s.memory_bytes.store(self.mem.bytes(), Ordering::Relaxed);
        s.disk_bytes.store(self.disk.as_ref().map_or(0, DiskIndex::bytes), Ordering::Relaxed);
    }

    /// Writes what memory holds to disk and stops the file thread.
    pub fn shutdown(mut self) {
        self.persist_all();
        if let Some((io, h)) = self.io.take() {
            drop(io);
            let _ = h.join();
        }
    }
}
