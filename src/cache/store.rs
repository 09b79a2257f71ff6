//! The persistent tier of the prompt cache: one safetensors file per entry
//! (the KV tensors, plus metadata: namespace, token ids, a compatibility key,
//! the layouts of paged layers, and a checksum of all of it: metadata,
//! tensor headers and data), written atomically (temp file, fsync, rename).
//! A file that is corrupt, truncated, or made by another model, tokenizer,
//! MLX version, device, KV layout or file-format version is never loaded.
//!
//! This module is plain Rust (bytes and files); MLX arrays are made from the
//! bytes on the scheduler thread.

use super::radix::Radix;
use crate::mlx::Dtype;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

const FORMAT: &str = "mlxrt-prompt-cache";
/// Bumped on any change to what an entry file holds (3: paged layers stored
/// as blocks with their layout, the checksum covers the header too).
pub const FORMAT_VERSION: u32 = 3;
/// Metadata keys of the store itself; other keys are the entry's own
/// (`EntryFile::meta`).
const RESERVED: [&str; 6] = ["format", "format_version", "compat", "namespace", "tokens", "checksum"];
const SUFFIX: &str = ".safetensors";

#[derive(Debug)]
pub struct Tensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<i32>,
    pub data: Vec<u8>,
}

/// One cache entry as stored on disk.
#[derive(Debug)]
pub struct EntryFile {
    pub namespace: String,
    pub tokens: Vec<u32>,
    pub tensors: Vec<Tensor>,
    /// Further metadata strings by key (a paged layer's layout), covered by
    /// the checksum like everything else.
    pub meta: BTreeMap<String, String>,
}

fn st_dtype(d: Dtype) -> Option<&'static str> {
    Some(match d {
        Dtype::F32 => "F32",
        Dtype::F16 => "F16",
        Dtype::BF16 => "BF16",
        Dtype::U32 => "U32",
        Dtype::U8 => "U8",
        Dtype::I8 => "I8",
        _ => return None,
    })
}

fn from_st_dtype(s: &str) -> Option<Dtype> {
    Some(match s {
        "F32" => Dtype::F32,
        "F16" => Dtype::F16,
        "BF16" => Dtype::BF16,
        "U32" => Dtype::U32,
        "U8" => Dtype::U8,
        "I8" => Dtype::I8,
        _ => return None,
    })
}

/// Bytes per element of the dtypes `st_dtype` stores.
fn elem_size(d: Dtype) -> usize {
    match d {
        Dtype::F32 | Dtype::U32 => 4,
        Dtype::U8 | Dtype::I8 => 1,
        _ => 2,
    }
}

/// The checksum of an entry: every metadata string but the checksum itself
/// (by key), every tensor's name, dtype, shape and offsets, and the data. So
/// a flipped byte anywhere (a token id, a block table entry) is caught.
fn checksum(meta: &BTreeMap<&str, &str>, tensors: &[TensorHeader], data: &[u8]) -> String {
    let mut crc = crc32fast::Hasher::new();
    for (k, v) in meta.iter().filter(|(k, _)| **k != "checksum") {
        crc.update(k.as_bytes());
        crc.update(&[0]);
        crc.update(v.as_bytes());
        crc.update(&[0]);
    }
    for t in tensors {
        crc.update(t.name.as_bytes());
        crc.update(&[0, t.dtype as u8]);
        for d in &t.shape {
            crc.update(&d.to_le_bytes());
        }
        crc.update(&(t.start as u64).to_le_bytes());
        crc.update(&(t.end as u64).to_le_bytes());
    }
    crc.update(data);
    format!("{:08x}", crc.finalize())
}

/// Serializes an entry (safetensors layout) stamped with `compat`.
pub fn encode(e: &EntryFile, compat: &str) -> Result<Vec<u8>, String> {
    if let Some(k) = e.meta.keys().find(|k| RESERVED.contains(&k.as_str())) {
        return Err(format!("metadata key `{k}` is the store's own"));
    }
    let mut header = Map::new();
    let mut offset = 0usize;
    let mut heads = vec![];
    for t in &e.tensors {
        let dt = st_dtype(t.dtype).ok_or_else(|| format!("dtype {:?} cannot be stored", t.dtype))?;
        header.insert(t.name.clone(), json!({"dtype": dt, "shape": t.shape, "data_offsets": [offset, offset + t.data.len()]}));
        heads.push(TensorHeader { name: t.name.clone(), dtype: t.dtype, shape: t.shape.clone(), start: offset, end: offset + t.data.len() });
        offset += t.data.len();
    }
    let (version, tokens) = (FORMAT_VERSION.to_string(), serde_json::to_string(&e.tokens).expect("ids serialize"));
    let mut meta: BTreeMap<&str, &str> = e.meta.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    meta.extend([
        ("format", FORMAT),
        ("format_version", version.as_str()),
        ("compat", compat),
        ("namespace", e.namespace.as_str()),
        ("tokens", tokens.as_str()),
    ]);
    let data: Vec<u8> = e.tensors.iter().flat_map(|t| t.data.iter().copied()).collect();
    let sum = checksum(&meta, &heads, &data);
    meta.insert("checksum", sum.as_str());
    header.insert("__metadata__".into(), json!(meta));
    let mut h = serde_json::to_vec(&Value::Object(header)).expect("header serializes");
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + h.len() + offset);
    out.extend_from_slice(&(h.len() as u64).to_le_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    Ok(out)
}

/// One tensor as an entry file's header describes it (offsets into the data).
struct TensorHeader {
    name: String,
    dtype: Dtype,
    shape: Vec<i32>,
    start: usize,
    end: usize,
}

/// What the header of an entry file says.
pub struct Header {
    pub namespace: String,
    pub tokens: Vec<u32>,
    compat: String,
    /// Every metadata string, the store's own included.
    meta: BTreeMap<String, String>,
    tensors: Vec<TensorHeader>,
    data_start: usize,
}

fn parse_header(bytes: &[u8]) -> Result<Header, String> {
    let n = u64::from_le_bytes(bytes.get(..8).ok_or("file shorter than a header")?.try_into().expect("8 bytes")) as usize;
    let raw = bytes.get(8..8usize.checked_add(n).ok_or("bad header size")?).ok_or("truncated header")?;
    let v: Value = serde_json::from_slice(raw).map_err(|e| format!("header is not JSON: {e}"))?;
    let obj = v.as_object().ok_or("header is not an object")?;
    let meta = obj.get("__metadata__").and_then(Value::as_object).ok_or("no metadata")?;
    let mut strings = BTreeMap::new();
    for (k, v) in meta {
        strings.insert(k.clone(), v.as_str().ok_or(format!("metadata `{k}` is not a string"))?.to_owned());
    }
    let s = |k: &str| strings.get(k).cloned().ok_or(format!("metadata lacks `{k}`"));
    if s("format")? != FORMAT {
        return Err("not an mlxrt prompt-cache file".into());
    }
    // Checked first: another version's fields are never read.
    let version = s("format_version")?;
    if version != FORMAT_VERSION.to_string() {
        return Err(format!("file format version {version}, this engine reads version {FORMAT_VERSION}"));
    }
    let tokens: Vec<u32> = serde_json::from_str(&s("tokens")?).map_err(|e| format!("bad token list: {e}"))?;
    let mut tensors = vec![];
    for (name, t) in obj.iter().filter(|(k, _)| *k != "__metadata__") {
        let dt = t.get("dtype").and_then(Value::as_str).and_then(from_st_dtype).ok_or(format!("tensor {name}: bad dtype"))?;
        let shape: Vec<i32> = serde_json::from_value(t.get("shape").cloned().unwrap_or_default()).map_err(|_| format!("tensor {name}: bad shape"))?;
        let off: Vec<usize> = serde_json::from_value(t.get("data_offsets").cloned().unwrap_or_default()).map_err(|_| format!("tensor {name}: bad offsets"))?;
        let [a, b] = off[..] else { return Err(format!("tensor {name}: bad offsets")) };
        if shape.iter().any(|&d| d < 0) {
            return Err(format!("tensor {name}: negative dimension"));
        }
        let count: usize = shape.iter().map(|&d| d as usize).product();
        if b < a || b - a != count * elem_size(dt) {
            return Err(format!("tensor {name}: size does not match its shape"));
        }
        tensors.push(TensorHeader { name: name.clone(), dtype: dt, shape, start: a, end: b });
    }
    tensors.sort_by_key(|t| t.start);
    // The tensors tile the data: no overlap, no gap.
    let mut end = 0;
    for t in &tensors {
        if t.start != end {
            return Err(format!("tensor {}: data overlaps or leaves a gap", t.name));
        }
        end = t.end;
    }
    Ok(Header {
        namespace: s("namespace")?,
        tokens,
        compat: format!("{}|v{version}", s("compat")?),
        meta: strings,
        tensors,
        data_start: 8 + n,
    })
}

fn compat_stamp(compat: &str) -> String {
    format!("{compat}|v{FORMAT_VERSION}")
}

/// Reads only the header of a file (for the index at startup).
pub fn read_header(path: &Path, compat: &str) -> Result<(Header, u64), String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    let mut size = [0u8; 8];
    f.read_exact(&mut size).map_err(|_| "file shorter than a header".to_string())?;
    let n = u64::from_le_bytes(size);
    if n > len.saturating_sub(8) || n > 1 << 30 {
        return Err("truncated or oversized header".into());
    }
    let mut buf = size.to_vec();
    buf.resize(8 + n as usize, 0);
    f.read_exact(&mut buf[8..]).map_err(|_| "truncated header".to_string())?;
    let h = parse_header(&buf)?;
    if h.compat != compat_stamp(compat) {
        return Err(format!("made for another model/tokenizer/MLX/device/format ({})", h.compat));
    }
    let data_len = h.tensors.last().map_or(0, |t| t.end);
    if (h.data_start + data_len) as u64 != len {
        return Err(format!("size {len} does not match its header (truncated?)"));
    }
    Ok((h, len))
}

/// Parses and verifies a whole file's bytes.
pub fn decode(bytes: &[u8], compat: &str) -> Result<EntryFile, String> {
    let h = parse_header(bytes)?;
    if h.compat != compat_stamp(compat) {
        return Err(format!("made for another model/tokenizer/MLX/device/format ({})", h.compat));
    }
    let data = &bytes[h.data_start.min(bytes.len())..];
    let end = h.tensors.last().map_or(0, |t| t.end);
    if data.len() != end {
        return Err(format!("tensor data is {} bytes, header says {end} (truncated?)", data.len()));
    }
    let meta: BTreeMap<&str, &str> = h.meta.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    if Some(&checksum(&meta, &h.tensors, data)[..]) != meta.get("checksum").copied() {
        return Err("checksum mismatch (corrupt file)".into());
    }
    let tensors = h
        .tensors
        .into_iter()
        .map(|t| Tensor { data: data[t.start..t.end].to_vec(), name: t.name, dtype: t.dtype, shape: t.shape })
        .collect();
    let meta = h.meta.into_iter().filter(|(k, _)| !RESERVED.contains(&k.as_str())).collect();
    Ok(EntryFile { namespace: h.namespace, tokens: h.tokens, tensors, meta })
}

/// The file name of an entry: a hash of namespace and tokens, so the same
/// entry always lands in the same file.
pub fn file_name(namespace: &str, tokens: &[u32]) -> String {
    let mut h = crc32fast::Hasher::new();
    h.update(namespace.as_bytes());
    h.update(&[0]);
    for t in tokens {
        h.update(&t.to_le_bytes());
    }
    format!("{:08x}-{}{SUFFIX}", h.finalize(), tokens.len())
}

/// Writes `bytes` to `dir/name` atomically: a temporary file in the same
/// folder, fsync, rename, fsync of the folder.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let path = dir.join(name);
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map(|_| path)
}

struct FileInfo {
    path: PathBuf,
    namespace: String,
    tokens: Vec<u32>,
    bytes: u64,
    used: SystemTime,
}

/// The files of the cache directory, indexed by namespace and tokens, under a
/// byte cap (least recently used files go first).
pub struct DiskIndex {
    pub dir: PathBuf,
    cap: u64,
    files: HashMap<u64, FileInfo>,
    trees: HashMap<String, Radix>,
    next_id: u64,
}

impl DiskIndex {
    /// Scans `dir` (created if missing). Files that cannot be used are
    /// removed, each reported through `log`; leftover temporary files too.
    pub fn open(dir: &Path, cap: u64, compat: &str, log: &dyn Fn(String)) -> std::io::Result<DiskIndex> {
        std::fs::create_dir_all(dir)?;
        let mut idx = DiskIndex { dir: dir.to_path_buf(), cap, files: HashMap::new(), trees: HashMap::new(), next_id: 1 };
        for e in std::fs::read_dir(dir)? {
            let path = e?.path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if name.starts_with('.') && name.contains(".tmp.") {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            if !name.ends_with(SUFFIX) {
                continue;
            }
            match read_header(&path, compat) {
                Ok((h, len)) => {
                    let used = std::fs::metadata(&path).and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH);
                    idx.add_file(h.namespace, h.tokens, path, len, used);
                }
                Err(why) => {
                    log(format!("prompt cache: skipping and removing {}: {why}", path.display()));
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        Ok(idx)
    }

    pub fn bytes(&self) -> u64 {
        self.files.values().map(|f| f.bytes).sum()
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    fn add_file(&mut self, namespace: String, tokens: Vec<u32>, path: PathBuf, bytes: u64, used: SystemTime) {
        let id = self.next_id;
        self.next_id += 1;
        if let Some(old) = self.trees.entry(namespace.clone()).or_default().insert(&tokens, id) {
            self.files.remove(&old);
        }
        self.files.insert(id, FileInfo { path, namespace, tokens, bytes, used });
    }

    /// Records a file just written; returns files to delete to respect the cap.
    pub fn added(&mut self, namespace: String, tokens: Vec<u32>, path: PathBuf, bytes: u64) -> Vec<PathBuf> {
        self.add_file(namespace, tokens, path, bytes, SystemTime::now());
        let mut out = vec![];
        while self.bytes() > self.cap {
            let (&oldest, _) = self.files.iter().min_by_key(|(_, f)| f.used).expect("over cap means non-empty");
            out.push(self.forget(oldest));
        }
        out
    }

    fn forget(&mut self, id: u64) -> PathBuf {
        let f = self.files.remove(&id).expect("live file");
        if let Some(t) = self.trees.get_mut(&f.namespace) {
            t.remove(&f.tokens);
        }
        f.path
    }

    /// The file sharing the longest prefix with `prompt`: (shared tokens, path).
    pub fn lookup(&mut self, namespace: &str, prompt: &[u32]) -> Option<(usize, PathBuf)> {
        let (n, id) = self.trees.get(namespace)?.longest(prompt)?;
        let f = self.files.get_mut(&id).expect("indexed file");
        f.used = SystemTime::now();
        Some((n, f.path.clone()))
    }

    /// The longest file whose tokens are a whole prefix of `prompt`.
    pub fn lookup_whole(&mut self, namespace: &str, prompt: &[u32]) -> Option<(usize, PathBuf)> {
        let (n, id) = self.trees.get(namespace)?.longest_whole(prompt)?;
        let f = self.files.get_mut(&id).expect("indexed file");
        f.used = SystemTime::now();
        Some((n, f.path.clone()))
    }

    /// Drops a file from the index (it could not be loaded); returns its path.
    pub fn remove_path(&mut self, path: &Path) -> Option<PathBuf> {
        let id = self.files.iter().find(|(_, f)| f.path == path).map(|(&id, _)| id)?;
        Some(self.forget(id))
    }

    /// Forgets every file and returns their paths (to delete).
    pub fn clear(&mut self) -> Vec<PathBuf> {
        let ids: Vec<u64> = self.files.keys().copied().collect();
        ids.into_iter().map(|id| self.forget(id)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tokens: Vec<u32>) -> EntryFile {
        let data: Vec<u8> = (0..24u8).collect();
        EntryFile {
            namespace: "ns".into(),
            tokens,
            tensors: vec![Tensor { name: "0.k".into(), dtype: Dtype::F32, shape: vec![1, 1, 2, 3], data }],
            meta: BTreeMap::from([("paged.0".to_string(), r#"{"block_table":[0,1]}"#.to_string())]),
        }
    }

    /// `bytes` with the first `from` in its header replaced by `to` (same
    /// length: the header size stays right).
    fn edit_header(bytes: &[u8], from: &str, to: &str) -> Vec<u8> {
        assert_eq!(from.len(), to.len());
        let n = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header = String::from_utf8(bytes[8..n].to_vec()).unwrap();
        assert!(header.contains(from), "{from} in {header}");
        let mut out = bytes[..8].to_vec();
        out.extend_from_slice(header.replacen(from, to, 1).as_bytes());
        out.extend_from_slice(&bytes[n..]);
        out
    }

    #[test]
    fn the_checksum_covers_metadata_and_tensor_headers() {
        let bytes = encode(&entry(vec![5, 6, 7]), "model-a").unwrap();
        assert_eq!(decode(&bytes, "model-a").unwrap().meta["paged.0"], r#"{"block_table":[0,1]}"#);
        // Still well-formed, but not what was written: a table entry, a
        // token id, a tensor's shape.
        for (from, to) in [(r#"[0,1]"#, r#"[1,0]"#), ("[5,6,7]", "[5,6,8]"), ("[1,1,2,3]", "[1,2,1,3]")] {
            let edited = edit_header(&bytes, from, to);
            assert!(decode(&edited, "model-a").unwrap_err().contains("checksum"), "{from} -> {to}");
        }
        let mut e = entry(vec![1]);
        e.meta.insert("tokens".into(), "[2]".into());
        assert!(encode(&e, "m").unwrap_err().contains("store's own"));
    }

    #[test]
    fn other_format_versions_are_refused_before_anything_is_read() {
        let bytes = encode(&entry(vec![5, 6, 7]), "model-a").unwrap();
        let old = edit_header(&bytes, &format!(r#""format_version":"{FORMAT_VERSION}""#), r#""format_version":"2""#);
        let err = decode(&old, "model-a").unwrap_err();
        assert!(err.contains("format version 2"), "{err}");
        let dir = std::env::temp_dir().join(format!("mlxrt-store-version-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        write_atomic(&dir, "old.safetensors", &old).unwrap();
        let logged = std::cell::RefCell::new(vec![]);
        let idx = DiskIndex::open(&dir, 1 << 20, "model-a", &|m| logged.borrow_mut().push(m)).unwrap();
        assert!(idx.is_empty() && logged.borrow()[0].contains("format version 2"), "{:?}", logged.borrow());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "the old file is removed");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn round_trip_and_rejections() {
        let bytes = encode(&entry(vec![5, 6, 7]), "model-a").unwrap();
        let e = decode(&bytes, "model-a").unwrap();
        assert_eq!((e.namespace.as_str(), e.tokens.clone()), ("ns", vec![5, 6, 7]));
        assert_eq!(e.tensors[0].data, (0..24u8).collect::<Vec<_>>());
        assert!(decode(&bytes, "model-b").unwrap_err().contains("another model"));
        let mut flipped = bytes.clone();
        *flipped.last_mut().unwrap() ^= 0x40;
        assert!(decode(&flipped, "model-a").unwrap_err().contains("checksum"));
        assert!(decode(&bytes[..bytes.len() - 5], "model-a").is_err());
        assert!(decode(&bytes[..10], "model-a").is_err());
        assert!(decode(b"", "model-a").is_err());
    }

    #[test]
    fn index_scans_skips_bad_files_and_caps() {
        let dir = std::env::temp_dir().join(format!("mlxrt-store-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let good = encode(&entry(vec![1, 2, 3]), "m").unwrap();
        write_atomic(&dir, &file_name("ns", &[1, 2, 3]), &good).unwrap();
        write_atomic(&dir, "other.safetensors", &encode(&entry(vec![9]), "other-model").unwrap()).unwrap();
        write_atomic(&dir, "cut.safetensors", &good[..good.len() - 3]).unwrap();
        std::fs::write(dir.join(".x.safetensors.tmp.1"), b"partial").unwrap();
        let logged = std::cell::RefCell::new(vec![]);
        let mut idx = DiskIndex::open(&dir, 1 << 20, "m", &|m| logged.borrow_mut().push(m)).unwrap();
        assert_eq!(idx.len(), 1);
        assert_eq!(logged.borrow().len(), 2, "{:?}", logged.borrow());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "bad and temporary files removed");
        assert_eq!(idx.lookup("ns", &[1, 2, 3, 4]).map(|x| x.0), Some(3));
        assert!(idx.lookup("other", &[1, 2, 3]).is_none());
        // cap: adding a second file over the cap drops the older one
        let p = write_atomic(&dir, &file_name("ns", &[8]), &good).unwrap();
        let mut small = DiskIndex { cap: good.len() as u64, ..idx };
        let gone = small.added("ns".into(), vec![8], p, good.len() as u64);
        assert_eq!(gone.len(), 1);
        assert!(small.lookup("ns", &[1, 2, 3]).is_none() && small.lookup("ns", &[8]).is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
