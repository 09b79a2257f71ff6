//! Hostile model files, generated here, through engine creation: each must
//! fail with `MODEL_LOAD` and a message naming the offending field, never
//! crash the process (MLX's GGUF reader follows lengths and offsets from the
//! file unchecked: a 64-byte GGUF whose first key length is 2^63 used to
//! segfault it). The checks themselves: src/model/check/.

mod common;

use common::*;
use mlxrt::engine::{Engine, EngineConfig};
use mlxrt::model::check::gguf::{self, build::Gguf};
use mlxrt::ErrorKind;
use std::path::{Path, PathBuf};

/// A scratch directory for this test binary.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mlxrt-hostile-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Engine creation on `path` must fail with MODEL_LOAD; returns the message.
fn load_error(path: &Path) -> String {
    match Engine::new(EngineConfig::new(path)) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => {
            assert_eq!(e.kind, ErrorKind::ModelLoad, "{}: {e}", path.display());
            e.message
        }
    }
}

fn gguf_error(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let path = dir.join(format!("{name}.gguf"));
    std::fs::write(&path, bytes).unwrap();
    load_error(&path)
}

#[test]
fn the_reported_crash_is_a_model_load_error() {
    let dir = scratch("crash");
    let mut g = Gguf::header(3, 0, 1);
    g.u64(1 << 63).u32(8);
    g.bytes.resize(64, 0);
    let m = gguf_error(&dir, "huge-key", &g.bytes);
    assert!(m.contains("GGUF metadata key 0: length 9223372036854775808 exceeds the file size"), "{m}");
}

#[test]
fn a_gguf_truncated_anywhere_fails_cleanly() {
    let dir = scratch("truncated");
    let g = gguf::build::small();
    assert!(gguf::check_bytes(&g.bytes).is_ok());
    // Every section boundary, and a cut inside every field of the header.
    let mut cuts: Vec<usize> = g.boundaries.iter().copied().filter(|&b| b < g.bytes.len()).collect();
    cuts.extend([0, 3, 4, 7, 8, 15, 16, 23, g.bytes.len() - 1]);
    for cut in cuts {
        let m = gguf_error(&dir, &format!("cut{cut}"), &g.bytes[..cut]);
        assert!(m.contains("GGUF"), "cut at {cut}: {m}");
    }
}

#[test]
fn hostile_gguf_fields_are_named() {
    let dir = scratch("fields");
    let header_only = |tensors: u64, kvs: u64| {
        let mut g = Gguf::header(3, tensors, kvs);
        g.bytes.resize(64, 0);
        g.bytes
    };
    let m = gguf_error(&dir, "kv-count", &header_only(0, u64::MAX));
    assert!(m.contains("metadata key count 18446744073709551615"), "{m}");
    let m = gguf_error(&dir, "tensor-count", &header_only(1 << 40, 0));
    assert!(m.contains("tensor count 1099511627776"), "{m}");

    // Tensor infos over a 64-byte data section, alignment 32.
    let file = |infos: &[(&str, &[u64], u32, u64)], alignment: u32| {
        let mut g = Gguf::header(3, infos.len() as u64, 1);
        g.kv_u32("general.alignment", alignment);
        for (name, dims, ty, off) in infos {
            g.tensor(name, dims, *ty, *off);
        }
        g.data(32, &[0; 64]);
        g.bytes
    };
    let m = gguf_error(&dir, "overlap", &file(&[("a", &[16], 0, 0), ("b", &[8], 0, 32)], 32));
    assert!(m.contains("`a` (bytes 0..64) and `b` (from byte 32) overlap"), "{m}");
    let m = gguf_error(&dir, "type", &file(&[("a", &[8], 1234, 0)], 32));
    assert!(m.contains("GGUF tensor 0 (`a`): ggml type 1234 is unknown"), "{m}");
    let m = gguf_error(&dir, "past-end", &file(&[("a", &[1 << 20], 0, 0)], 32));
    assert!(m.contains("GGUF tensor `a`") && m.contains("end past the end"), "{m}");
    let m = gguf_error(&dir, "alignment", &file(&[("a", &[8], 0, 0)], 0));
    assert!(m.contains("`general.alignment` is 0, not a power of two"), "{m}");
    let m = gguf_error(&dir, "misaligned", &file(&[("a", &[8], 0, 4)], 32));
    assert!(m.contains("offset 4 is not a multiple of the alignment 32"), "{m}");

    let mut g = Gguf::header(3, 0, 1);
    g.string("tokenizer.ggml.tokens").u32(9).u32(8).u64(1 << 62);
    g.bytes.resize(128, 0);
    let m = gguf_error(&dir, "array", &g.bytes);
    assert!(m.contains("`tokenizer.ggml.tokens`: array length 4611686018427387904 exceeds the file size"), "{m}");
}

/// A file the check accepts goes through MLX's reader and fails later, on
/// what the model needs, with the field named.
#[test]
fn a_valid_gguf_with_absurd_sizes_fails_naming_them() {
    let dir = scratch("sizes");
    let m = gguf_error(&dir, "small", &gguf::build::small().bytes);
    assert!(m.contains("`llama.attention.head_count` is missing"), "{m}");

    let mut g = Gguf::header(3, 0, 5);
    g.kv_string("general.architecture", "llama")
        .kv_u32("llama.attention.head_count", 0)
        .kv_u32("llama.embedding_length", 64)
        .kv_u32("llama.block_count", 1)
        .kv_u32("llama.feed_forward_length", 128);
    let m = gguf_error(&dir, "heads", &g.bytes);
    assert!(m.contains("`llama.attention.head_count` is 0"), "{m}");
}

#[test]
fn the_default_model_passes_the_check() {
    let l = gguf::check_file(&model_path()).unwrap();
    assert!(l.tensors > 100 && l.metadata_keys > 20, "{l:?}");
}

/// A model folder with `config` and one safetensors file of `bytes`.
fn folder(name: &str, config: serde_json::Value, safetensors: &[u8]) -> PathBuf {
    let dir = scratch(name);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::write(dir.join("model.safetensors"), safetensors).unwrap();
    dir
}

fn llama_config() -> serde_json::Value {
    serde_json::json!({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "vocab_size": 100})
}

fn safetensors(header: &[u8], data: usize) -> Vec<u8> {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header);
    b.resize(b.len() + data, 0);
    b
}

#[test]
fn hostile_safetensors_headers_are_named() {
    let mut huge = (1u64 << 62).to_le_bytes().to_vec();
    huge.extend_from_slice(b"{}");
    let m = load_error(&folder("st-len", llama_config(), &huge));
    assert!(m.contains("header length 4611686018427387904 exceeds the file size"), "{m}");

    let cases = [
        (r#"{"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, "u": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}"#, "`t` and `u` overlap"),
        (r#"{"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 1024]}}"#, "tensor `t`: data_offsets [0, 1024] are outside the 32-byte data section"),
        (r#"{"t": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}}"#, "tensor `t`: shape dimension 0 is -4"),
        (r#"{"t": {"dtype": "Q9", "shape": [4], "data_offsets": [0, 16]}}"#, "tensor `t`: dtype \"Q9\" is not supported"),
        (r#"{"t": {"dtype": "F32", "shape": [8], "data_offsets": [0, 16]}}"#, "needs 32"),
        (r#"[1, 2]"#, "not a JSON object"),
        (r#"{"t": "#, "not valid JSON"),
    ];
    for (i, (header, want)) in cases.iter().enumerate() {
        let m = load_error(&folder(&format!("st{i}"), llama_config(), &safetensors(header.as_bytes(), 32)));
        assert!(m.contains(want), "{header}: {m}");
    }
}

#[test]
fn absurd_config_sizes_are_named() {
    let ok_file = safetensors(br#"{"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}"#, 4);
    let cases = [
        ("hidden_size", serde_json::json!(1u64 << 40), "`hidden_size` is 1099511627776"),
        ("num_hidden_layers", serde_json::json!(0), "`num_hidden_layers` is 0"),
        ("vocab_size", serde_json::json!(0), "`vocab_size` is 0"),
        ("intermediate_size", serde_json::json!(-1), "`intermediate_size` is -1"),
        ("num_key_value_heads", serde_json::json!(3), "not a multiple of `num_key_value_heads`"),
    ];
    for (key, value, want) in cases {
        let mut c = llama_config();
        c[key] = value;
        let m = load_error(&folder(&format!("cfg-{key}"), c, &ok_file));
        assert!(m.contains(want), "{key}: {m}");
    }
}
