//! A safetensors file's header, checked before MLX reads it: MLX allocates
//! the header by its declared length, converts shapes to `int` without a
//! check and reads each tensor at its offset lazily, at evaluation. Here the
//! header length must fit the file (and MLX's 100 MB limit), the header be a
//! JSON object of tensors with a known dtype, a shape of integers in
//! `0..2^31` and `data_offsets` inside the data section whose length is
//! exactly dtype × shape, no two tensors overlapping; `__metadata__`, when
//! present, is null or maps strings to strings.

use crate::error::{Error, Result};
use serde_json::Value;
use std::io::Read;
use std::path::Path;

/// MLX's (and the safetensors crate's) limit on the header.
const MAX_HEADER: u64 = 100_000_000;

/// The dtypes MLX reads, with their sizes in bytes.
const DTYPES: &[(&str, u64)] = &[
    ("BOOL", 1),
    ("U8", 1),
    ("I8", 1),
    ("U16", 2),
    ("I16", 2),
    ("F16", 2),
    ("BF16", 2),
    ("U32", 4),
    ("I32", 4),
    ("F32", 4),
    ("U64", 8),
    ("I64", 8),
    ("C64", 8),
];

/// Checks the safetensors file at `path` (see the module docs).
pub fn check_file(path: &Path) -> Result<()> {
    let name = path.display();
    let mut file = std::fs::File::open(path).map_err(|e| Error::model(format!("cannot open {name}: {e}")))?;
    let len = file.metadata().map_err(|e| Error::model(format!("cannot stat {name}: {e}")))?.len();
    let mut n = [0u8; 8];
    if len < 8 {
        return Err(Error::model(format!("{name}: {len} bytes, shorter than the 8-byte header length")));
    }
    file.read_exact(&mut n).map_err(|e| Error::model(format!("{name}: {e}")))?;
    let n = u64::from_le_bytes(n);
    if n == 0 || n > len - 8 {
        return Err(Error::model(format!("{name}: header length {n} exceeds the file size ({len} bytes)")));
    }
    if n >= MAX_HEADER {
        return Err(Error::model(format!("{name}: header length {n} exceeds the limit of {MAX_HEADER}")));
    }
    let mut header = vec![0; n as usize];
    file.read_exact(&mut header).map_err(|e| Error::model(format!("{name}: reading the header: {e}")))?;
    check_header(&header, len - 8 - n).map_err(|e| e.context(name))
}

/// Checks a header (the JSON after the length) against a data section of
/// `data_len` bytes.
pub fn check_header(header: &[u8], data_len: u64) -> Result<()> {
    let json: Value =
        serde_json::from_slice(header).map_err(|e| Error::model(format!("the header is not valid JSON: {e}")))?;
    let Value::Object(entries) = json else { return Err(Error::model("the header is not a JSON object")) };
    let mut spans = Vec::new();
    for (name, v) in &entries {
        if name == "__metadata__" {
            // MLX writes `null` when a file has no metadata.
            let ok = v.is_null() || v.as_object().is_some_and(|m| m.values().all(Value::is_string));
            if !ok {
                return Err(Error::model("`__metadata__` is not null or an object of strings"));
            }
            continue;
        }
        let bad = |why: String| Error::model(format!("tensor `{name}`: {why}"));
        let dtype = v.get("dtype").and_then(Value::as_str).ok_or_else(|| bad("no `dtype` string".into()))?;
        let size = DTYPES
            .iter()
            .find(|(d, _)| *d == dtype)
            .map(|(_, s)| *s)
            .ok_or_else(|| bad(format!("dtype {dtype:?} is not supported")))?;
        let shape = v.get("shape").and_then(Value::as_array).ok_or_else(|| bad("no `shape` array".into()))?;
        let mut bytes = size;
        for (i, d) in shape.iter().enumerate() {
            let d = d
                .as_u64()
                .filter(|&d| d <= i32::MAX as u64)
                .ok_or_else(|| bad(format!("shape dimension {i} is {d}, not an integer in 0..2^31")))?;
            bytes = bytes.checked_mul(d).ok_or_else(|| bad(format!("shape {shape:?} overflows")))?;
        }
        let offsets = v.get("data_offsets").and_then(Value::as_array);
        let (begin, end) = match offsets.map(|o| o.iter().map(Value::as_u64).collect::<Vec<_>>()).as_deref() {
            Some([Some(b), Some(e)]) => (*b, *e),
            _ => return Err(bad("`data_offsets` is not two non-negative integers".into())),
        };
        if begin > end || end > data_len {
            return Err(bad(format!("data_offsets [{begin}, {end}] are outside the {data_len}-byte data section")));
        }
        if end - begin != bytes {
            return Err(bad(format!("data_offsets [{begin}, {end}] hold {} bytes, {dtype} {shape:?} needs {bytes}", end - begin)));
        }
        spans.push((begin, end, name));
    }
    spans.sort();
    for w in spans.windows(2) {
        if w[0].1 > w[1].0 {
            return Err(Error::model(format!("tensors `{}` and `{}` overlap", w[0].2, w[1].2)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_header;
    use serde_json::json;

    fn err(h: serde_json::Value, data: u64) -> String {
        let e = check_header(h.to_string().as_bytes(), data).expect_err("a hostile header passed");
        assert_eq!(e.kind, crate::ErrorKind::ModelLoad);
        e.message
    }

    #[test]
    fn accepts_a_valid_header() {
        let h = json!({"__metadata__": null, "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}});
        check_header(h.to_string().as_bytes(), 4).unwrap();
        let h = json!({"__metadata__": {"format": "mlx"},
            "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
            "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]}});
        check_header(h.to_string().as_bytes(), 32).unwrap();
    }

    #[test]
    fn names_the_bad_field() {
        let t = |v: serde_json::Value| json!({ "t": v });
        assert!(err(json!([1]), 0).contains("not a JSON object"));
        assert!(check_header(b"{\"t\":", 0).unwrap_err().message.contains("not valid JSON"));
        assert!(err(json!({"__metadata__": {"a": 1}}), 0).contains("`__metadata__`"));
        assert!(err(t(json!({"dtype": "F8", "shape": [1], "data_offsets": [0, 1]})), 1).contains("tensor `t`: dtype \"F8\""));
        assert!(err(t(json!({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]})), 4).contains("shape dimension 0 is -1"));
        assert!(err(t(json!({"dtype": "F32", "shape": [1u64 << 40], "data_offsets": [0, 4]})), 4).contains("dimension 0 is 1099511627776"));
        assert!(err(t(json!({"dtype": "F32", "shape": [1], "data_offsets": [0, 8]})), 4).contains("outside the 4-byte data section"));
        assert!(err(t(json!({"dtype": "F32", "shape": [2], "data_offsets": [0, 4]})), 8).contains("needs 8"));
        assert!(err(t(json!({"dtype": "F32", "shape": [1], "data_offsets": [4, 0]})), 8).contains("data_offsets [4, 0]"));
        assert!(err(t(json!({"dtype": "F32", "shape": [1]})), 8).contains("`data_offsets`"));
        assert!(err(t(json!({"shape": [1], "data_offsets": [0, 4]})), 8).contains("no `dtype`"));
        let overlap = json!({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}});
        assert!(err(overlap, 12).contains("`a` and `b` overlap"));
    }
}
