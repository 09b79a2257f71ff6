//! Quantized KV (issue 11) in the prompt cache: a quantized layer's snapshot
//! holds its packed planes (and, below the row's `quantized_kv_start`, the
//! float copy a cold run keeps too), so a hit from memory or from disk
//! after a restart gives exactly the cold run's tokens; an engine opened
//! with another scheme or start on the same directory never loads those
//! files. Dense paged entries (`kv_paging`) round-trip the same way. Tiny random-weight llama (tests/oracle/make_tiny.py `llama_kv`,
//! head_dim 64) and SmolLM2 (the default GGUF), greedy decoding.

mod common;

use common::*;
use mlxrt::cache::scheme::{KvQuant, KvScheme};
use mlxrt::engine::{Engine, EngineConfig, Event, Input, RequestOptions};
use std::path::{Path, PathBuf};
use std::process::Command;

const STEPS: u32 = 12;
const CHUNK: usize = 16;
const AFFINE4: KvScheme = KvScheme::Affine { bits: 4, group_size: 64 };
const K8V3: KvScheme = KvScheme::TurboQuant { key_bits: 8, value_bits: 3 };

fn modified(p: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// The `llama_kv` tiny model folder (shared with tests/kv_quant.rs), built
/// when missing or older than its script.
fn folder() -> PathBuf {
    static ONE_WRITER: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_WRITER.lock().unwrap_or_else(|e| e.into_inner());
    let script = repo_root().join("tests/oracle/make_tiny.py");
    let out = repo_root().join("target/oracle/kv/llama_kv");
    let fresh = modified(&out.join("config.json")).zip(modified(&script)).is_some_and(|(o, s)| o > s);
    if !fresh {
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        let gguf = model_path();
        let args = [script.to_str().unwrap(), "--family", "llama_kv", "--out", out.to_str().unwrap(), "--gguf", gguf.to_str().unwrap()];
        let o = Command::new(python()).args(args).output().expect("run python (scripts/setup.sh makes the venv)");
        assert!(o.status.success(), "make_tiny.py failed:\n{}", String::from_utf8_lossy(&o.stderr));
    }
    out
}

fn engine(folder: &Path, kv: KvQuant, dir: Option<&Path>) -> Engine {
    engine_paged(folder, kv, dir, false)
}

/// `engine`, with `kv_paging` (blocks of 32) when `paged`.
fn engine_paged(folder: &Path, kv: KvQuant, dir: Option<&Path>, paged: bool) -> Engine {
    let mut cfg = EngineConfig::new(folder);
    cfg.kv_paging = paged;
    cfg.kv_block_size = 32;
    cfg.prefill_chunk = CHUNK;
    cfg.kv = kv;
    cfg.prompt_cache_bytes = if dir.is_some() { 64 << 20 } else { 0 };
    cfg.prompt_cache_min_tokens = 8;
    cfg.prompt_cache_dir = dir.map(Path::to_path_buf);
    Engine::new(cfg).unwrap()
}

const SYSTEM: &str = "You are the assistant of a small bakery in the old town. It opens at seven in the morning, \
                      closes at six in the evening, and sells bread, pastries, tarts and birthday cakes; orders \
                      above twenty euros are delivered for free within the city, and cakes need two days notice.";

fn ask(user: &str, cache: bool, start: Option<i32>) -> RequestOptions {
    let messages = serde_json::json!([{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]);
    let mut o = RequestOptions::new(Input::Messages(messages));
    o.max_tokens = STEPS;
    o.stop_at_eos = false;
    o.prompt_cache = cache;
    o.quantized_kv_start = start;
    o
}

/// (tokens, cached prompt tokens)
fn go(e: &Engine, o: RequestOptions) -> (Vec<u32>, u32) {
    let ev = run(e, o);
    let Some(Event::Done { usage, .. }) = ev.last() else { panic!("{ev:?}") };
    (tokens_of(&ev), usage.cached_tokens)
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mlxrt-kv-persist-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn entry_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.filter(|e| e.as_ref().is_ok_and(|e| e.path().extension().is_some_and(|x| x == "safetensors"))).count())
}

/// A boundary snapshot (the system message) reused from memory, then from
/// disk by a new engine, gives the cold run's tokens; so does the snapshot
/// of a whole conversation reused by its next turn.
fn round_trip(f: &Path, kv: KvQuant, tag: &str) {
    round_trip_paged(f, kv, tag, false)
}

/// `round_trip`, the caching engines paged when `paged` (the cold one never).
fn round_trip_paged(f: &Path, kv: KvQuant, tag: &str, paged: bool) {
    let dir = temp_dir(tag);
    let cold = engine(f, kv, None);
    let warm = engine_paged(f, kv, Some(&dir), paged);
    let label = format!("{} start {} paged {paged}", kv.scheme.name(), kv.start);

    let (t1, c1) = go(&warm, ask("When do you open?", true, None));
    assert_eq!(c1, 0, "{label}");
    assert_eq!(t1, go(&cold, ask("When do you open?", false, None)).0, "{label}: stopping at the boundary changed the result");
    let (t2, c2) = go(&warm, ask("Do you deliver cakes?", true, None));
    assert!(c2 > 40, "{label}: the boundary snapshot was not used ({c2} cached tokens)");
    let cold2 = go(&cold, ask("Do you deliver cakes?", false, None)).0;
    assert_eq!(t2, cold2, "{label}: a memory hit changed the result");

    warm.flush_prompt_cache().unwrap();
    drop(warm);
    assert!(entry_files(&dir) > 0, "{label}: nothing was written to {}", dir.display());
    let again = engine_paged(f, kv, Some(&dir), paged);
    let (t3, c3) = go(&again, ask("Do you deliver cakes?", true, None));
    if kv.scheme.is_quantized() {
        assert_eq!(c3, c2, "{label}: the entry was not loaded from disk");
    } else {
        // Dense KV is cut back: the second question's own entry serves all
        // of its prompt but the last token.
        let len = again.tokenize_input(&ask("Do you deliver cakes?", true, None)).unwrap().len() as u32;
        assert_eq!(c3, len - 1, "{label}: the entry was not loaded from disk");
    }
    assert_eq!(t3, cold2, "{label}: a disk hit changed the result");
    assert!(wait_idle(&again).prompt_cache_hits >= 1, "{label}");
    drop(again);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn affine4_snapshots_round_trip() {
    // Quantized from the first token; from inside the system message (the
    // boundary snapshot holds packed planes only); past the whole prompt
    // (the snapshots hold the float copy too).
    for (start, tag) in [(0, "a4s0"), (16, "a4s16"), (4096, "a4s4096")] {
        round_trip(&folder(), KvQuant { scheme: AFFINE4, start, ..KvQuant::default() }, tag);
    }
}

#[test]
fn turboquant_snapshots_round_trip() {
    for (start, tag) in [(0, "tqs0"), (16, "tqs16")] {
        round_trip(&folder(), KvQuant { scheme: K8V3, start, ..KvQuant::default() }, tag);
    }
}

/// Dense KV with `kv_paging`: entries stored as blocks (a boundary that
/// ends inside a block), loaded back into the pool by a new engine.
#[test]
fn paged_snapshots_round_trip() {
    round_trip_paged(&folder(), KvQuant::default(), "paged", true);
    round_trip_paged(&model_path(), KvQuant::default(), "smol-paged", true);
}

/// The real model (the default SmolLM2 GGUF), both schemes.
#[test]
fn smollm2_snapshots_round_trip() {
    let gguf = model_path();
    round_trip(&gguf, KvQuant { scheme: AFFINE4, start: 16, ..KvQuant::default() }, "smol-a4");
    round_trip(&gguf, KvQuant { scheme: K8V3, start: 0, ..KvQuant::default() }, "smol-tq");
}

/// Files made under one scheme and start are never loaded under another
/// (the compatibility key drops them), and in one engine a request with
/// another `quantized_kv_start` never uses an entry of the default one.
#[test]
fn another_scheme_or_start_never_loads() {
    let f = folder();
    let dir = temp_dir("compat");
    let made = KvQuant { scheme: AFFINE4, start: 16, ..KvQuant::default() };
    let e = engine(&f, made, Some(&dir));
    go(&e, ask("When do you open?", true, None));
    let (_, c) = go(&e, ask("Do you deliver cakes?", true, None));
    assert!(c > 0, "the entry was not used under its own scheme");
    // Same engine, another start: a miss, and its tokens are the cold run's.
    let (t, c) = go(&e, ask("Do you deliver cakes?", true, Some(0)));
    assert_eq!(c, 0, "a request with another start used an entry of the default start");
    let cold = engine(&f, KvQuant { scheme: AFFINE4, start: 0, ..KvQuant::default() }, None);
    assert_eq!(t, go(&cold, ask("Do you deliver cakes?", false, None)).0);
    e.flush_prompt_cache().unwrap();
    drop(e);
    assert!(entry_files(&dir) > 0);

    for other in [
        KvQuant { scheme: AFFINE4, start: 0, ..KvQuant::default() },
        KvQuant { scheme: KvScheme::Affine { bits: 8, group_size: 64 }, start: 16, ..KvQuant::default() },
        KvQuant { scheme: KvScheme::Affine { bits: 4, group_size: 32 }, start: 16, ..KvQuant::default() },
        KvQuant { scheme: K8V3, start: 16, ..KvQuant::default() },
        KvQuant::default(),
    ] {
        let o = engine(&f, other, Some(&dir));
        let (_, c) = go(&o, ask("Do you deliver cakes?", true, None));
        assert_eq!(c, 0, "{} start {}: loaded an entry of another scheme or start", other.scheme.name(), other.start);
        drop(o);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
