//! The structure of a GGUF file (v2/v3, little-endian), checked before MLX's
//! GGUF reader (gguflib) maps it: that reader follows every length, count,
//! type id and offset in the file without a bounds check, so one bad field is
//! a read out of bounds, a division by zero or a NULL dereference inside
//! libmlx. This check accepts exactly what that reader handles safely:
//!
//! - the header: magic `GGUF`, version 2 or 3, counts the file can hold;
//! - metadata: keys (UTF-8, unique, at most 65,535 bytes), value types 0–11
//!   (no float64: MLX advances by 4 bytes over its 8 and misreads what
//!   follows), strings and arrays within the file and below 2^31 (MLX reads
//!   their lengths as `int`), no nested arrays, and `general.alignment` a
//!   power-of-two uint32;
//! - tensor infos: unique UTF-8 names, 1–4 dimensions of 1 to 2^28 with at
//!   most 2^31-1 elements (MLX sizes quantized buffers with `int`), a ggml type
//!   MLX can load, rows a whole number of quantization blocks;
//! - data: each tensor's offset aligned and its bytes inside the file, no two
//!   tensors overlapping.
//!
//! The file is read front to back through a bounded reader (tensor data is
//! never read); nothing is allocated by a count before that count has been
//! checked against the bytes left in the file.

use crate::error::{Error, Result};
use std::collections::HashSet;
use std::io::{BufReader, Read};
use std::path::Path;

/// Magic, version, tensor count, key-value count.
const HEADER_BYTES: u64 = 24;
/// The smallest key-value (empty key, type, one-byte value) and tensor info
/// (empty name, one dimension, type, offset): bounds on what the counts may say.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
const MIN_TENSOR_BYTES: u64 = 8 + 4 + 8 + 4 + 8;
/// Longest key or tensor name (the GGUF spec's limit for keys).
const MAX_NAME: u64 = 65_535;
/// MLX reads string and array lengths, dimensions and quantized element
/// counts as `int`.
const MAX_INT: u64 = i32::MAX as u64;
/// Largest dimension: MLX computes a quantized row's packed width as
/// `int(row * 8)`.
const MAX_DIM: u64 = 1 << 28;
const MAX_DIMS: u32 = 4;

const TYPE_STRING: u32 = 8;
const TYPE_ARRAY: u32 = 9;
const TYPE_F64: u32 = 12;
const TYPE_U32: u32 = 4;

/// Bytes of a fixed-size metadata value type (float64 excluded, see above).
fn scalar_bytes(ty: u32) -> Option<u64> {
    match ty {
        0 | 1 | 7 => Some(1),  // uint8, int8, bool
        2 | 3 => Some(2),      // uint16, int16
        4..=6 => Some(4),      // uint32, int32, float32
        10 | 11 => Some(8),    // uint64, int64
        _ => None,
    }
}

/// A ggml tensor type MLX's reader turns into an array (directly, as affine
/// quantization, or dequantized to f16): id, name, elements per block, bytes
/// per block. Other types (and unknown ids) index past gguflib's tables or
/// reach a zero block size there.
struct GgmlType {
    id: u32,
    name: &'static str,
    block: u64,
    block_bytes: u64,
}

const GGML_TYPES: &[GgmlType] = &[
    GgmlType { id: 0, name: "F32", block: 1, block_bytes: 4 },
    GgmlType { id: 1, name: "F16", block: 1, block_bytes: 2 },
    GgmlType { id: 2, name: "Q4_0", block: 32, block_bytes: 18 },
    GgmlType { id: 3, name: "Q4_1", block: 32, block_bytes: 20 },
    GgmlType { id: 8, name: "Q8_0", block: 32, block_bytes: 34 },
    GgmlType { id: 10, name: "Q2_K", block: 256, block_bytes: 82 },
    GgmlType { id: 12, name: "Q4_K", block: 256, block_bytes: 144 },
    GgmlType { id: 14, name: "Q6_K", block: 256, block_bytes: 210 },
    GgmlType { id: 24, name: "I8", block: 1, block_bytes: 1 },
    GgmlType { id: 25, name: "I16", block: 1, block_bytes: 2 },
    GgmlType { id: 26, name: "I32", block: 1, block_bytes: 4 },
    GgmlType { id: 30, name: "BF16", block: 1, block_bytes: 2 },
];

/// What the check learned: enough for tests and callers to see it read the
/// whole structure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub version: u32,
    pub metadata_keys: u64,
    pub tensors: u64,
    pub alignment: u64,
    /// Where tensor data starts (offsets in the file are relative to it).
    pub data_start: u64,
}

/// Checks the GGUF file at `path` (see the module docs).
pub fn check_file(path: &Path) -> Result<Layout> {
    let file = std::fs::File::open(path).map_err(|e| Error::model(format!("cannot open {}: {e}", path.display())))?;
    let len = file.metadata().map_err(|e| Error::model(format!("cannot stat {}: {e}", path.display())))?.len();
    check(BufReader::with_capacity(1 << 16, file), len)
}

/// Checks GGUF bytes held in memory (the fuzz target's entry point).
#[doc(hidden)]
pub fn check_bytes(bytes: &[u8]) -> Result<Layout> {
    check(bytes, bytes.len() as u64)
}

fn check<R: Read>(inner: R, len: u64) -> Result<Layout> {
    if len < HEADER_BYTES {
        return Err(Error::model(format!("GGUF file is {len} bytes, shorter than the {HEADER_BYTES}-byte header")));
    }
    let mut r = Reader { inner, pos: 0, len };
    let magic = r.array::<4>(|| "the magic".into())?;
    if &magic != b"GGUF" {
        return Err(Error::model(format!("not a GGUF file: it starts with {magic:02x?}, not \"GGUF\"")));
    }
    let version = r.u32(|| "the version".into())?;
    if !(2..=3).contains(&version) {
        return Err(Error::model(format!("GGUF version {version} is not supported (2 or 3)")));
    }
    let tensors = r.u64(|| "the tensor count".into())?;
    let metadata_keys = r.u64(|| "the metadata key count".into())?;
    let room = r.left();
    if metadata_keys > room / MIN_KV_BYTES {
        return Err(Error::model(format!(
            "GGUF metadata key count {metadata_keys} is more than a {len}-byte file can hold"
        )));
    }
    if tensors > room / MIN_TENSOR_BYTES {
        return Err(Error::model(format!("GGUF tensor count {tensors} is more than a {len}-byte file can hold")));
    }

    let mut alignment = 32;
    let mut keys = HashSet::new();
    for i in 0..metadata_keys {
        let key = r.name(|| format!("GGUF metadata key {i}"))?;
        let at = || format!("GGUF metadata `{key}`");
        let ty = r.u32(at)?;
        if !keys.insert(key.clone()) {
            return Err(Error::model(format!("{} appears twice", at())));
        }
        if key == "general.alignment" {
            if ty != TYPE_U32 {
                return Err(Error::model(format!("{}: value type {ty}, not uint32 ({TYPE_U32})", at())));
            }
            let a = r.u32(at)?;
            if !a.is_power_of_two() {
                return Err(Error::model(format!("{} is {a}, not a power of two", at())));
            }
            alignment = u64::from(a);
        } else {
            r.value(ty, &at)?;
        }
    }

    struct Tensor {
        name: String,
        offset: u64,
        bytes: u64,
    }
    let mut infos = Vec::new();
    let mut names = HashSet::new();
    for i in 0..tensors {
        let name = r.name(|| format!("GGUF tensor {i}"))?;
        let at = || format!("GGUF tensor {i} (`{name}`)");
        if !names.insert(name.clone()) {
            return Err(Error::model(format!("{}: the name appears twice", at())));
        }
        let ndim = r.u32(at)?;
        if !(1..=MAX_DIMS).contains(&ndim) {
            return Err(Error::model(format!("{}: {ndim} dimensions (1 to {MAX_DIMS} supported)", at())));
        }
        let mut elements: u64 = 1;
        let mut row = 0;
        for d in 0..ndim {
            let n = r.u64(at)?;
            if n == 0 || n > MAX_DIM {
                return Err(Error::model(format!("{}: dimension {d} is {n} (1 to {MAX_DIM})", at())));
            }
            if d == 0 {
                row = n;
            }
            elements = elements.saturating_mul(n);
        }
        if elements > MAX_INT {
            return Err(Error::model(format!("{}: {elements} elements (at most {MAX_INT})", at())));
        }
        let ty = r.u32(at)?;
        let Some(t) = GGML_TYPES.iter().find(|t| t.id == ty) else {
            let known: Vec<_> = GGML_TYPES.iter().map(|t| format!("{} ({})", t.name, t.id)).collect();
            return Err(Error::model(format!(
                "{}: ggml type {ty} is unknown or not supported (supported: {})",
                at(),
                known.join(", ")
            )));
        };
        if row % t.block != 0 {
            return Err(Error::model(format!(
                "{}: row length {row} is not a multiple of the {} block of {} elements",
                at(),
                t.name,
                t.block
            )));
        }
        // elements < 2^31 and block_bytes < 2^9: no overflow.
        let bytes = elements / t.block * t.block_bytes;
        let offset = r.u64(at)?;
        if offset % alignment != 0 {
            return Err(Error::model(format!("{}: offset {offset} is not a multiple of the alignment {alignment}", at())));
        }
        infos.push(Tensor { name, offset, bytes });
    }

    // The data section starts at the next multiple of the alignment
    // (a power of two below 2^32, so this cannot overflow).
    let data_start = r.pos.div_ceil(alignment) * alignment;
    for t in &infos {
        let end = data_start.checked_add(t.offset).and_then(|s| s.checked_add(t.bytes));
        if end.is_none_or(|e| e > len) {
            return Err(Error::model(format!(
                "GGUF tensor `{}`: its {} bytes at offset {} (after the data section start {data_start}) end past the end of the {len}-byte file",
                t.name, t.bytes, t.offset
            )));
        }
    }
    infos.sort_by_key(|t| t.offset);
    for w in infos.windows(2) {
        if w[0].offset + w[0].bytes > w[1].offset {
            return Err(Error::model(format!(
                "GGUF tensors `{}` (bytes {}..{}) and `{}` (from byte {}) overlap",
                w[0].name,
                w[0].offset,
                w[0].offset + w[0].bytes,
                w[1].name,
                w[1].offset
            )));
        }
    }
    Ok(Layout { version, metadata_keys, tensors, alignment, data_start })
}

/// Reads front to back, never past `len`, naming the field it was reading
/// when the file ends.
struct Reader<R> {
    inner: R,
    pos: u64,
    len: u64,
}

impl<R: Read> Reader<R> {
    fn left(&self) -> u64 {
        self.len - self.pos
    }

    fn need(&self, n: u64, what: impl Fn() -> String) -> Result<()> {
        if n > self.left() {
            return Err(Error::model(format!(
                "GGUF file is truncated: {} needs {n} bytes at offset {}, the file has {}",
                what(),
                self.pos,
                self.len
            )));
        }
        Ok(())
    }

    fn io(&self, e: std::io::Error, what: impl Fn() -> String) -> Error {
        Error::model(format!("GGUF file: reading {} at offset {}: {e}", what(), self.pos))
    }

    fn array<const N: usize>(&mut self, what: impl Fn() -> String) -> Result<[u8; N]> {
        self.need(N as u64, &what)?;
        let mut b = [0; N];
        self.inner.read_exact(&mut b).map_err(|e| self.io(e, &what))?;
        self.pos += N as u64;
        Ok(b)
    }

    fn u32(&mut self, what: impl Fn() -> String) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: impl Fn() -> String) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn skip(&mut self, n: u64, what: impl Fn() -> String) -> Result<()> {
        self.need(n, &what)?;
        let copied = std::io::copy(&mut (&mut self.inner).take(n), &mut std::io::sink());
        let copied = copied.map_err(|e| self.io(e, &what))?;
        if copied != n {
            return Err(Error::model(format!("GGUF file: {} ends early at offset {}", what(), self.pos + copied)));
        }
        self.pos += n;
        Ok(())
    }

    /// A string's length prefix, checked against the bytes left and `max`.
    fn string_len(&mut self, max: u64, what: impl Fn() -> String) -> Result<u64> {
        let n = self.u64(&what)?;
        if n > self.left() {
            return Err(Error::model(format!("{}: length {n} exceeds the file size", what())));
        }
        if n > max {
            return Err(Error::model(format!("{}: length {n} exceeds the limit of {max}", what())));
        }
        Ok(n)
    }

    /// A key or tensor name: length-prefixed UTF-8.
    fn name(&mut self, what: impl Fn() -> String) -> Result<String> {
        let n = self.string_len(MAX_NAME, &what)?;
        let mut b = vec![0; n as usize];
        self.inner.read_exact(&mut b).map_err(|e| self.io(e, &what))?;
        self.pos += n;
        String::from_utf8(b).map_err(|_| Error::model(format!("{}: the name is not UTF-8", what())))
    }

    /// Skips one metadata value of type `ty`.
    fn value(&mut self, ty: u32, at: &impl Fn() -> String) -> Result<()> {
        match ty {
            TYPE_STRING => {
                let n = self.string_len(MAX_INT, at)?;
                self.skip(n, at)
            }
            TYPE_ARRAY => {
                let elem = self.u32(at)?;
                let n = self.u64(at)?;
                let too_long = || Error::model(format!("{}: array length {n} exceeds the file size", at()));
                match elem {
                    TYPE_STRING => {
                        // Each string takes at least its 8-byte length.
                        if n > self.left() / 8 || n > MAX_INT {
                            return Err(too_long());
                        }
                        for j in 0..n {
                            let s = || format!("{}: string {j}", at());
                            let m = self.string_len(MAX_INT, s)?;
                            self.skip(m, s)?;
                        }
                        Ok(())
                    }
                    TYPE_ARRAY => Err(Error::model(format!("{}: nested arrays are not supported", at()))),
                    TYPE_F64 => Err(Error::model(format!("{}: float64 arrays are not supported", at()))),
                    t => {
                        let size = scalar_bytes(t).ok_or_else(|| {
                            Error::model(format!("{}: array element type {t} is unknown", at()))
                        })?;
                        if n > MAX_INT || n * size > self.left() {
                            return Err(too_long());
                        }
                        self.skip(n * size, at)
                    }
                }
            }
            TYPE_F64 => Err(Error::model(format!("{}: float64 values are not supported", at()))),
            t => {
                let size =
                    scalar_bytes(t).ok_or_else(|| Error::model(format!("{}: value type {t} is unknown", at())))?;
                self.skip(size, at)
            }
        }
    }
}

/// Writes small GGUF files field by field: for tests and the fuzz seeds.
#[doc(hidden)]
pub mod build {
    /// Bytes of a GGUF file under construction, with the offsets where each
    /// section ends (for truncation tests).
    #[derive(Default)]
    pub struct Gguf {
        pub bytes: Vec<u8>,
        pub boundaries: Vec<usize>,
    }

    impl Gguf {
        pub fn header(version: u32, tensors: u64, kvs: u64) -> Gguf {
            let mut g = Gguf::default();
            g.bytes.extend_from_slice(b"GGUF");
            g.u32(version).u64(tensors).u64(kvs).mark();
            g
        }
        pub fn u32(&mut self, v: u32) -> &mut Gguf {
            self.bytes.extend_from_slice(&v.to_le_bytes());
            self
        }
        pub fn u64(&mut self, v: u64) -> &mut Gguf {
            self.bytes.extend_from_slice(&v.to_le_bytes());
            self
        }
        pub fn string(&mut self, s: &str) -> &mut Gguf {
            self.u64(s.len() as u64);
            self.bytes.extend_from_slice(s.as_bytes());
            self
        }
        /// Records the current length as a section boundary.
        pub fn mark(&mut self) -> &mut Gguf {
            self.boundaries.push(self.bytes.len());
            self
        }
        pub fn kv_string(&mut self, key: &str, value: &str) -> &mut Gguf {
            self.string(key).u32(8).string(value).mark()
        }
        pub fn kv_u32(&mut self, key: &str, value: u32) -> &mut Gguf {
            self.string(key).u32(4).u32(value).mark()
        }
        pub fn kv_strings(&mut self, key: &str, values: &[&str]) -> &mut Gguf {
            self.string(key).u32(9).u32(8).u64(values.len() as u64);
            for v in values {
                self.string(v);
            }
            self.mark()
        }
        pub fn kv_i32s(&mut self, key: &str, values: &[i32]) -> &mut Gguf {
            self.string(key).u32(9).u32(5).u64(values.len() as u64);
            for v in values {
                self.bytes.extend_from_slice(&v.to_le_bytes());
            }
            self.mark()
        }
        /// A tensor info: `dims` in ggml order (row length first).
        pub fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Gguf {
            self.string(name).u32(dims.len() as u32);
            for &d in dims {
                self.u64(d);
            }
            self.u32(ty).u64(offset).mark()
        }
        /// Pads to `alignment`, then appends tensor data.
        pub fn data(&mut self, alignment: usize, data: &[u8]) -> &mut Gguf {
            while self.bytes.len() % alignment != 0 {
                self.bytes.push(0);
            }
            self.mark();
            self.bytes.extend_from_slice(data);
            self.mark()
        }
    }

    /// A small valid file: a few metadata values of every kind the models
    /// use and three tensors (F32, F16 and Q8_0) at aligned offsets.
    pub fn small() -> Gguf {
        let mut g = Gguf::header(3, 3, 5);
        g.kv_string("general.architecture", "llama")
            .kv_u32("general.alignment", 32)
            .kv_u32("llama.block_count", 1)
            .kv_strings("tokenizer.ggml.tokens", &["a", "b", "<|end|>"])
            .kv_i32s("tokenizer.ggml.token_type", &[1, 1, 3]);
        // 4 f32 (16 bytes) at 0, 8 f16 (16 bytes) at 32, one Q8_0 block (34 bytes) at 64.
        g.tensor("a.weight", &[4], 0, 0).tensor("b.weight", &[4, 2], 1, 32).tensor("c.weight", &[32], 8, 64);
        let mut data = vec![0u8; 64 + 34];
        data[..4].copy_from_slice(&1.0f32.to_le_bytes());
        g.data(32, &data);
        g
    }
}

#[cfg(test)]
mod tests {
    use super::build::{small, Gguf};
    use super::*;

    fn err(bytes: &[u8]) -> String {
        let e = check_bytes(bytes).expect_err("a hostile file passed the check");
        assert_eq!(e.kind, crate::ErrorKind::ModelLoad, "{e}");
        e.message
    }

    #[test]
    fn accepts_a_small_valid_file() {
        let g = small();
        let l = check_bytes(&g.bytes).unwrap();
        assert_eq!((l.version, l.metadata_keys, l.tensors, l.alignment), (3, 5, 3, 32));
        assert_eq!(l.data_start % 32, 0);
    }

    #[test]
    fn rejects_every_truncation() {
        let g = small();
        for cut in 0..g.bytes.len() {
            let m = err(&g.bytes[..cut]);
            assert!(m.contains("GGUF"), "cut at {cut}: {m}");
        }
    }

    #[test]
    fn names_a_huge_key_length() {
        // The reported crash: 64 bytes, first key length 2^63.
        let mut g = Gguf::header(3, 0, 1);
        g.u64(1 << 63).u32(8);
        g.bytes.resize(64, 0);
        assert_eq!(err(&g.bytes), "GGUF metadata key 0: length 9223372036854775808 exceeds the file size");
    }

    #[test]
    fn names_huge_counts() {
        let mut g = Gguf::header(3, 0, u64::MAX);
        g.bytes.resize(64, 0);
        assert!(err(&g.bytes).contains("metadata key count 18446744073709551615"));
        let mut g = Gguf::header(3, 1 << 40, 0);
        g.bytes.resize(64, 0);
        assert!(err(&g.bytes).contains("tensor count 1099511627776"));
    }

    #[test]
    fn names_bad_metadata() {
        let case = |f: &dyn Fn(&mut Gguf)| {
            let mut g = Gguf::header(3, 0, 1);
            f(&mut g);
            g.bytes.resize(g.bytes.len() + 64, 0);
            err(&g.bytes)
        };
        assert!(case(&|g| {
            g.string("k").u32(13);
        })
        .contains("`k`: value type 13 is unknown"));
        assert!(case(&|g| {
            g.string("k").u32(12);
        })
        .contains("float64"));
        assert!(case(&|g| {
            g.string("k").u32(8).u64(1 << 40);
        })
        .contains("`k`: length 1099511627776 exceeds the file size"));
        assert!(case(&|g| {
            g.string("k").u32(9).u32(8).u64(u64::MAX);
        })
        .contains("`k`: array length 18446744073709551615"));
        assert!(case(&|g| {
            g.string("k").u32(9).u32(4).u64(1 << 62);
        })
        .contains("array length 4611686018427387904 exceeds the file size"));
        assert!(case(&|g| {
            g.string("k").u32(9).u32(9).u64(1);
        })
        .contains("nested"));
        assert!(case(&|g| {
            g.string("k").u32(9).u32(77).u64(1);
        })
        .contains("element type 77"));
        assert!(case(&|g| {
            g.string("k").u32(9).u32(8).u64(1).u64(1 << 50);
        })
        .contains("`k`: string 0: length 1125899906842624"));
        assert!(case(&|g| {
            g.kv_u32("general.alignment", 0);
        })
        .contains("`general.alignment` is 0, not a power of two"));
        assert!(case(&|g| {
            g.string("general.alignment").u32(5).u32(32);
        })
        .contains("not uint32"));
        let mut g = Gguf::header(3, 0, 2);
        g.kv_u32("k", 1).kv_u32("k", 2);
        assert!(err(&g.bytes).contains("`k` appears twice"));
        let mut g = Gguf::header(3, 0, 1);
        g.u64(2).bytes.extend_from_slice(&[0xff, 0xfe]);
        g.u32(4).u32(1);
        assert!(err(&g.bytes).contains("key 0: the name is not UTF-8"));
    }

    #[test]
    fn names_bad_headers() {
        let mut g = small();
        g.bytes[0] = b'X';
        assert!(err(&g.bytes).contains("not a GGUF file"));
        let mut g = small();
        g.bytes[4] = 1;
        assert!(err(&g.bytes).contains("GGUF version 1 is not supported"));
    }

    /// `small()` with its tensor infos replaced.
    fn tensors(infos: &[(&str, &[u64], u32, u64)], data: usize) -> Vec<u8> {
        let mut g = Gguf::header(3, infos.len() as u64, 1);
        g.kv_u32("general.alignment", 32);
        for (name, dims, ty, off) in infos {
            g.tensor(name, dims, *ty, *off);
        }
        g.data(32, &vec![0; data]);
        g.bytes
    }

    #[test]
    fn names_bad_tensors() {
        assert!(check_bytes(&tensors(&[("t", &[8], 0, 0), ("u", &[8], 0, 32)], 64)).is_ok());
        let e = err(&tensors(&[("t", &[8], 0, 0), ("u", &[8], 0, 32)], 63));
        assert!(e.contains("GGUF tensor `u`: its 32 bytes at offset 32") && e.contains("end past the end"), "{e}");
        let e = err(&tensors(&[("t", &[16], 0, 0), ("u", &[8], 0, 32)], 64));
        assert!(e.contains("`t` (bytes 0..64) and `u` (from byte 32) overlap"), "{e}");
        let e = err(&tensors(&[("t", &[8], 0, 0), ("t", &[8], 0, 32)], 64));
        assert!(e.contains("tensor 1 (`t`): the name appears twice"), "{e}");
        let e = err(&tensors(&[("t", &[8], 99, 0)], 64));
        assert!(e.contains("tensor 0 (`t`): ggml type 99 is unknown or not supported"), "{e}");
        let e = err(&tensors(&[("t", &[8], 4, 0)], 64));
        assert!(e.contains("ggml type 4"), "a deprecated type with a zero block size: {e}");
        let e = err(&tensors(&[("t", &[8], 0, 8)], 64));
        assert!(e.contains("offset 8 is not a multiple of the alignment 32"), "{e}");
        let e = err(&tensors(&[("t", &[16], 2, 0)], 64));
        assert!(e.contains("row length 16 is not a multiple of the Q4_0 block of 32"), "{e}");
        let e = err(&tensors(&[("t", &[8, 0], 0, 0)], 64));
        assert!(e.contains("dimension 1 is 0"), "{e}");
        let e = err(&tensors(&[("t", &[1 << 40], 0, 0)], 64));
        assert!(e.contains("dimension 0 is 1099511627776"), "{e}");
        let e = err(&tensors(&[("t", &[1 << 16, 1 << 16], 0, 0)], 64));
        assert!(e.contains("4294967296 elements"), "{e}");
        let e = err(&tensors(&[("t", &[1, 1, 1, 1, 1], 0, 0)], 64));
        assert!(e.contains("5 dimensions"), "{e}");
        let e = err(&tensors(&[("t", &[8], 0, u64::MAX - 31)], 64));
        assert!(e.contains("end past the end"), "offset overflow: {e}");
    }
}
