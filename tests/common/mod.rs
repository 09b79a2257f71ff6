//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod media;

use mlxrt::cache::LayerCache;
use mlxrt::engine::{Engine, EngineConfig, Event, Input, RequestOptions};
use mlxrt::mlx::io::{Meta, TensorFile};
use mlxrt::mlx::{self, Array};
use mlxrt::model::{LoadedModel, Output};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

/// The default model (scripts/setup.sh puts it there). Tests fail, not skip,
/// when it is missing: the test command always runs the setup first.
pub fn model_path() -> PathBuf {
    let p = std::env::var_os("MLXRT_MODEL").map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME").expect("HOME is set");
        PathBuf::from(home).join(".cache/mlxrt/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    });
    assert!(p.exists(), "model {} is missing: run scripts/setup.sh", p.display());
    p
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where cargo put libmlxrt.so for this test run: target/<profile>/deps,
/// next to the test binary. (`cargo test` builds the cdylib there but copies
/// it up to target/<profile> only on `cargo build`.)
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().to_path_buf();
    assert!(dir.join(if cfg!(target_os = "macos") { "libmlxrt.dylib" } else { "libmlxrt.so" }).exists(), "no libmlxrt in {}", dir.display());
    dir
}

/// Compiles tests/c/`source`.c with the system C compiler (C11, warnings as
/// errors, plus `extra` flags) against the built cdylib into `out`, next to
/// the library.
pub fn compile_c(source: &str, out: &str, extra: &[&str]) -> PathBuf {
    let (root, lib) = (repo_root(), lib_dir());
    let bin = lib.join(out);
    let mut cmd = std::process::Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cmd.args(["-std=c11", "-g", "-O1", "-Wall", "-Wextra", "-Werror"])
        .args(extra)
        .arg(format!("-I{}", root.join("include").display()))
        .arg(root.join(format!("tests/c/{source}.c")))
        .arg(format!("-L{}", lib.display()))
        .arg("-lmlxrt")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lpthread", "-o"])
        .arg(&bin);
    let st = cmd.status().expect("run the C compiler");
    assert!(st.success(), "compiling {source}.c failed: {cmd:?}");
    bin
}

/// Makes a compiled C/C++/Objective-C program load the library this test run
/// built. cargo's LD_LIBRARY_PATH lists target/<profile> (where only `cargo
/// build` copies the library, so it may be stale) before deps/, and it
/// overrides the program's RUNPATH.
pub fn this_library(cmd: &mut std::process::Command) -> &mut std::process::Command {
    let mut path = std::ffi::OsString::from(lib_dir());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(":");
        path.push(old);
    }
    cmd.env("LD_LIBRARY_PATH", path)
}

pub fn python() -> PathBuf {
    let p = repo_root().join(".venv/bin/python");
    assert!(p.exists(), "{} is missing: run scripts/setup.sh", p.display());
    p
}

/// The `LD_PRELOAD` that gives a Python process the BLAS this test binary's
/// libmlx binds to: OpenBLAS when build.rs linked it (see
/// docs/cpu-kernels.md), else nothing (both use the wheel's reference BLAS).
/// Float attention's matmuls (`cblas_sgemm`) round differently on the two,
/// by ~1e-7, which quantized KV can turn into a whole level of a K/V element.
pub fn blas_preload() -> String {
    let b = mlx::blas_info();
    if b.is_openblas() {
        b.library
    } else {
        String::new()
    }
}

/// Runs the venv's Python on `args` with this process's BLAS (see
/// `blas_preload`), so that mlx-lm computes exactly what mlxrt's stock
/// kernels compute; panics with its stderr if it fails.
pub fn py(args: &[&str]) {
    let mut cmd = Command::new(python());
    let preload = blas_preload();
    if !preload.is_empty() {
        let old = std::env::var("LD_PRELOAD").unwrap_or_default();
        cmd.env("LD_PRELOAD", if old.is_empty() { preload } else { format!("{preload}:{old}") });
        if let Some(t) = mlx::blas_info().openblas_threads {
            cmd.env("OPENBLAS_NUM_THREADS", t.to_string());
        }
    }
    let out = cmd.args(args).output().expect("run python");
    assert!(out.status.success(), "python {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
}

pub fn modified(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// Whether `out` exists and is newer than each of `inputs` that exists.
pub fn newer_than(out: &Path, inputs: &[PathBuf]) -> bool {
    modified(out).is_some_and(|o| inputs.iter().filter_map(|i| modified(i)).all(|i| o > i))
}

/// Whether the mlx-lm reference `out` (tests/oracle/mlxlm_reference.py) is
/// newer than `inputs` and was made with this process's BLAS.
pub fn reference_fresh(out: &Path, inputs: &[PathBuf]) -> bool {
    newer_than(out, inputs)
        && TensorFile::load_safetensors(out.to_str().unwrap())
            .and_then(|f| f.meta("ld_preload"))
            .is_ok_and(|m| matches!(m, Some(Meta::Str(s)) if s == blas_preload()))
}

/// Runs tests/oracle/mlxlm_reference.py: mlx-lm's greedy tokens and logits
/// for `model` on `prompts` into `out`; `extra` adds options.
pub fn mlxlm_reference(model: &Path, prompts: &Path, steps: usize, logit_steps: &str, out: &Path, extra: &[&str]) {
    let script = repo_root().join("tests/oracle/mlxlm_reference.py");
    let steps = steps.to_string();
    let mut args = vec![
        script.to_str().unwrap(),
        "--model",
        model.to_str().unwrap(),
        "--prompts",
        prompts.to_str().unwrap(),
        "--steps",
        &steps,
        "--logit-steps",
        logit_steps,
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend(extra);
    py(&args);
}

/// Greedy steps of the parity references, and the steps whose logits they keep.
pub const PARITY_STEPS: usize = 64;
const PARITY_LOGIT_STEPS: &str = "0,1,8,31,63";

/// The default model as an MLX folder (converted from the GGUF by
/// tests/oracle) and mlx-lm's greedy tokens and logits for
/// tests/oracle/parity_prompts.json on it.
pub struct ParityOracle {
    pub folder: PathBuf,
    pub reference: PathBuf,
}

/// Makes the parity oracle, once per test binary (tests/parity.rs and the
/// tests that compare other engine settings with mlx-lm).
pub fn parity_oracle() -> &'static ParityOracle {
    static ORACLE: std::sync::OnceLock<ParityOracle> = std::sync::OnceLock::new();
    ORACLE.get_or_init(|| {
        let dir = repo_root().join("target/oracle");
        std::fs::create_dir_all(&dir).unwrap();
        let folder = dir.join("smollm2-mlx");
        let reference = dir.join("parity_reference.safetensors");
        let scripts = repo_root().join("tests/oracle");
        py(&[scripts.join("gguf_to_mlx.py").to_str().unwrap(), model_path().to_str().unwrap(), folder.to_str().unwrap()]);
        let prompts = scripts.join("parity_prompts.json");
        mlxlm_reference(&folder, &prompts, PARITY_STEPS, PARITY_LOGIT_STEPS, &reference, &["--f32-scales"]);
        ParityOracle { folder, reference }
    })
}

/// Runs tests/oracle/make_tiny.py: a tiny random-weight model of `family`
/// (mlx-lm's own class) into `out`; `extra` adds options.
pub fn make_tiny(family: &str, out: &Path, extra: &[&str]) {
    let (script, gguf) = (repo_root().join("tests/oracle/make_tiny.py"), model_path());
    let mut args = vec![script.to_str().unwrap(), "--family", family, "--out", out.to_str().unwrap(), "--gguf", gguf.to_str().unwrap()];
    args.extend(extra);
    py(&args);
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Asserts that `tokens` are mlx-lm's for case `c` and `logits` (at its
/// logit steps) within `tol` of mlx-lm's; returns the max |Δ logits|.
pub fn assert_matches(label: &str, c: &Case, tokens: &[u32], logits: &[Vec<f32>], tol: f32) -> f32 {
    assert_eq!(tokens, c.tokens, "{label}/{}: greedy tokens differ from mlx-lm", c.name);
    let mut worst = 0f32;
    for (i, step) in c.logit_steps.iter().enumerate() {
        let d = max_abs_diff(&logits[i], &c.logits[i]);
        assert!(d <= tol, "{label}/{} step {step}: max |Δ logits| {d} > {tol}", c.name);
        worst = worst.max(d);
    }
    worst
}

/// Evaluates the caches' arrays.
pub fn eval_cache(cache: &[LayerCache]) {
    let state: Vec<&Array> = cache.iter().flat_map(|c| c.state()).collect();
    mlx::eval(&state).unwrap();
}

/// Greedy decoding through the model API from the empty `cache`, prefilling
/// as mlx-lm's `generate_step` and the engine do (all but the last prompt
/// token in chunks of `chunk`, then one token per step): `steps` tokens and
/// the logits of the steps in `keep`.
pub fn greedy(
    m: &LoadedModel,
    mut cache: Vec<LayerCache>,
    prompt: &[u32],
    chunk: usize,
    steps: usize,
    keep: &[usize],
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let ids: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
    let n = ids.len();
    for part in ids[..n - 1].chunks(chunk) {
        let x = Array::from_i32(part, &[1, part.len() as i32]).unwrap();
        m.model.forward(&x, &mut cache, Output::CacheOnly).unwrap();
        eval_cache(&cache);
    }
    let mut next = ids[n - 1];
    let (mut tokens, mut kept) = (vec![], vec![]);
    for step in 0..steps {
        let x = Array::from_i32(&[next], &[1, 1]).unwrap();
        let logits = m.model.forward(&x, &mut cache, Output::LastLogits).unwrap().unwrap().reshape(&[-1]).unwrap();
        next = logits.argmax(-1, false).unwrap().item_i32().unwrap();
        if keep.contains(&step) {
            kept.push(logits.to_vec_f32().unwrap());
        }
        tokens.push(next as u32);
    }
    (tokens, kept)
}

/// A request for exactly `steps` tokens after `prompt` (EOS ignored).
pub fn token_request(prompt: &[u32], steps: usize, chunk: Option<usize>) -> RequestOptions {
    let mut o = RequestOptions::new(Input::Tokens(prompt.to_vec()));
    o.max_tokens = steps as u32;
    o.stop_at_eos = false;
    o.prefill_chunk = chunk;
    o
}

/// A chat request for exactly `steps` tokens (EOS ignored), through the
/// prompt cache or not, prefilled in chunks of `chunk`.
pub fn chat_request(messages: serde_json::Value, steps: usize, cache: bool, chunk: usize) -> RequestOptions {
    let mut o = RequestOptions::new(Input::Messages(messages));
    o.max_tokens = steps as u32;
    o.stop_at_eos = false;
    o.prompt_cache = cache;
    o.prefill_chunk = Some(chunk);
    o
}

/// Runs a request: its tokens and how many prompt tokens came from the
/// prompt cache.
pub fn tokens_and_cached(e: &Engine, o: RequestOptions) -> (Vec<u32>, u32) {
    let ev = run(e, o);
    let Some(Event::Done { usage, .. }) = ev.last() else { panic!("{ev:?}") };
    (tokens_of(&ev), usage.cached_tokens)
}

pub fn engine() -> Engine {
    Engine::new(EngineConfig::new(model_path())).expect("engine loads the default model")
}

pub fn chat(user: &str) -> RequestOptions {
    RequestOptions::new(Input::Messages(serde_json::json!([{"role": "user", "content": user}])))
}

/// Submits a request; its events arrive on the receiver.
pub fn submit(engine: &Engine, opts: RequestOptions) -> mpsc::Receiver<Event> {
    let (tx, rx) = mpsc::channel();
    engine
        .submit(opts, Box::new(move |ev: &Event| {
            let _ = tx.send(ev.clone());
        }))
        .expect("submit");
    rx
}

/// Submits and collects every event until the terminal one.
pub fn run(engine: &Engine, opts: RequestOptions) -> Vec<Event> {
    collect(&submit(engine, opts))
}

/// Every event until the terminal one, within 300 s.
pub fn collect(rx: &mpsc::Receiver<Event>) -> Vec<Event> {
    collect_polling(rx, Duration::from_secs(300), || {})
}

/// `collect`, calling `poll` before each wait of at most `every` (sampling
/// the engine's stats while the request runs).
pub fn collect_polling(rx: &mpsc::Receiver<Event>, every: Duration, mut poll: impl FnMut()) -> Vec<Event> {
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    let mut out = vec![];
    loop {
        poll();
        match rx.recv_timeout(every) {
            Ok(ev) => {
                let end = ev.is_terminal();
                out.push(ev);
                if end {
                    return out;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => assert!(std::time::Instant::now() < deadline, "events within 300 s"),
            Err(err) => panic!("{err}"),
        }
    }
}

/// Stats once the scheduler has published an idle state (it does so after
/// each unit of work, a moment after the last terminal event).
pub fn wait_idle(engine: &Engine) -> mlxrt::engine::EngineStats {
    for _ in 0..200 {
        let s = engine.stats();
        if s.in_flight == 0 && s.active == 0 && s.queued == 0 {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    engine.stats()
}

pub fn text_of(events: &[Event]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Delta { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

pub fn tokens_of(events: &[Event]) -> Vec<u32> {
    events
        .iter()
        .flat_map(|e| match e {
            Event::Delta { tokens, .. } => tokens.clone(),
            _ => vec![],
        })
        .collect()
}

/// One prompt of an mlx-lm reference file (tests/oracle/*reference*.py):
/// its ids, mlx-lm's greedy tokens and last-position logits at `logit_steps`.
pub struct Case {
    pub name: String,
    pub prompt: Vec<u32>,
    pub tokens: Vec<u32>,
    pub logit_steps: Vec<usize>,
    /// `[n_logit_steps][vocab]`
    pub logits: Vec<Vec<f32>>,
}

/// Every case of a reference file, sorted by name.
pub fn reference_cases(reference: &Path) -> Vec<Case> {
    let mut f = TensorFile::load_safetensors(reference.to_str().unwrap()).unwrap();
    let mut names: Vec<String> =
        f.names().unwrap().iter().filter_map(|n| n.strip_suffix(".prompt_ids").map(str::to_owned)).collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let ids = |f: &mut TensorFile, k: &str| -> Vec<u32> {
                f.take(&format!("{name}.{k}")).unwrap().to_vec_i32().unwrap().iter().map(|&x| x as u32).collect()
            };
            let prompt = ids(&mut f, "prompt_ids");
            let tokens = ids(&mut f, "tokens");
            let logit_steps = ids(&mut f, "logit_steps").iter().map(|&s| s as usize).collect();
            let l = f.take(&format!("{name}.logits")).unwrap();
            let vocab = l.dim(-1) as usize;
            let logits = l.to_vec_f32().unwrap().chunks(vocab).map(<[f32]>::to_vec).collect();
            Case { name, prompt, tokens, logit_steps, logits }
        })
        .collect()
}

/// The tiny random-weight Gemma 3 vision-language checkpoint and mlx-vlm's
/// reference outputs for it (tests/oracle/make_tiny_vlm.py): `model/`,
/// `images/` and `reference.safetensors`. Built once per change of the script
/// (cached under target/oracle/media); needs mlx-vlm in the venv
/// (scripts/setup.sh installs it). Made once per test binary: tests running
/// at once wait for one build instead of racing on the folder.
pub fn tiny_vlm() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| media_oracle("media", "make_tiny_vlm.py")).clone()
}

/// The tiny random-weight Qwen3-VL checkpoint and mlx-vlm's reference
/// outputs (tests/oracle/make_tiny_qwen_vl.py), laid out as `tiny_vlm()`.
pub fn tiny_qwen_vl() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| media_oracle("media_qwen_vl", "make_tiny_qwen_vl.py")).clone()
}

/// The tiny random-weight Gemma 4 checkpoint (vision and audio towers) and
/// mlx-vlm's reference outputs (tests/oracle/make_tiny_gemma4_vlm.py).
pub fn tiny_gemma4_vlm() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| media_oracle("media_gemma4", "make_tiny_gemma4_vlm.py")).clone()
}

/// Runs the media oracle `script` into target/oracle/`name` unless its
/// output is newer than the script and make_tiny_vlm.py (whose images and
/// helpers the others share).
fn media_oracle(name: &str, script: &str) -> PathBuf {
    let dir = repo_root().join("target/oracle").join(name);
    let oracle = repo_root().join("tests/oracle");
    let (script, shared) = (oracle.join(script), oracle.join("make_tiny_vlm.py"));
    if !reference_fresh(&dir.join("reference.safetensors"), &[script.clone(), shared]) {
        let _ = std::fs::remove_dir_all(&dir);
        let gguf = model_path();
        py(&[script.to_str().unwrap(), "--out", dir.to_str().unwrap(), "--gguf", gguf.to_str().unwrap()]);
    }
    dir
}

/// A test image of `tiny_vlm()` for the binding tests: the PNG's path, and a
/// file of its decoded pixels (packed RGB8, as mlxrt decodes it) with its
/// width and height.
pub fn tiny_vlm_image(dir: &Path) -> (PathBuf, PathBuf, usize, usize) {
    use mlxrt::media::{decode, Limits};
    let png = dir.join("images/odd_png.png");
    let img = decode(&std::fs::read(&png).unwrap(), &Limits::default()).unwrap();
    let raw = dir.join("odd_png.rgb");
    // Written aside and renamed: tests running at once each see a whole file.
    let tmp = dir.join(format!("odd_png.rgb.{}.{:?}", std::process::id(), std::thread::current().id()));
    std::fs::write(&tmp, &img.data).unwrap();
    std::fs::rename(&tmp, &raw).unwrap();
    (png, raw, img.width, img.height)
}

/// The 0.5 s clip of `tiny_gemma4_vlm()` for the binding tests: the WAV's
/// path, and a file of its decoded samples (native f32, as mlxrt decodes it).
pub fn tiny_gemma4_clip(dir: &Path) -> (PathBuf, PathBuf) {
    let wav = dir.join("audio/tone_wav.wav");
    let audio = mlxrt::media::decode_wav(&std::fs::read(&wav).unwrap(), &mlxrt::media::Limits::default()).unwrap();
    let raw = dir.join("tone_wav.f32");
    let tmp = dir.join(format!("tone_wav.f32.{}.{:?}", std::process::id(), std::thread::current().id()));
    std::fs::write(&tmp, audio.samples.iter().flat_map(|s| s.to_ne_bytes()).collect::<Vec<u8>>()).unwrap();
    std::fs::rename(&tmp, &raw).unwrap();
    (wav, raw)
}

/// mlx-vlm's greedy tokens for a case of `tiny_vlm()` (e.g. "one_png": its
/// odd_png.png, then "What is in this picture?").
pub fn tiny_vlm_tokens(dir: &Path, case: &str) -> Vec<u32> {
    let mut r = TensorFile::load_safetensors(dir.join("reference.safetensors").to_str().unwrap()).unwrap();
    r.take(&format!("{case}.tokens")).unwrap().to_vec_i32().unwrap().into_iter().map(|t| t as u32).collect()
}

/// Greedy steps of the family references, and the steps whose logits they keep.
pub const FAMILY_STEPS: usize = 32;
const FAMILY_LOGIT_STEPS: &str = "0,1,8,31";

/// Builds the tiny model of `family` in `variant` ("f32", "q4": 4-bit
/// quantized, "bf16") and records mlx-lm's outputs for
/// tests/oracle/family_prompts.json, once per change of the scripts (cached
/// under target/oracle/families). Tests that compare a family with mlx-lm
/// (tests/families.rs, and other engine settings).
pub fn family_oracle(family: &str, variant: &str) -> (PathBuf, PathBuf) {
    // Tests run in parallel and share the files.
    static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _once = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let name = format!("tiny-{family}-{variant}");
    let dir = repo_root().join("target/oracle/families");
    let folder = dir.join(&name);
    let reference = dir.join(format!("{name}.reference.safetensors"));
    let scripts = repo_root().join("tests/oracle");
    let prompts = scripts.join("family_prompts.json");
    // Rebuilt when a script or the prompts changed since.
    let inputs = [scripts.join("make_tiny.py"), scripts.join("mlxlm_reference.py"), prompts.clone()];
    if !reference_fresh(&reference, &inputs) {
        let _ = std::fs::remove_dir_all(&folder);
        let extra: &[&str] = match variant {
            "q4" => &["--quantize", "4"],
            "bf16" => &["--dtype", "bfloat16"],
            _ => &[],
        };
        make_tiny(family, &folder, extra);
        mlxlm_reference(&folder, &prompts, FAMILY_STEPS, FAMILY_LOGIT_STEPS, &reference, &[]);
    }
    (folder, reference)
}

/// `gemma3_kv`'s sliding window (tests/oracle/make_tiny.py).
pub const RING_WINDOW: usize = 16;
/// Greedy steps of the sliding-window references.
pub const RING_STEPS: usize = 24;
const RING_LOGIT_STEPS: &str = "0,1,12,23";

/// Prompt ids for the sliding-window references (any ids of the vocabulary
/// do): one shorter than the window, the others 3 to 7 windows long.
fn ring_prompts() -> Vec<(String, Vec<u32>)> {
    let w = RING_WINDOW;
    [7, 3 * w + 5, 5 * w + 1, 7 * w + 2]
        .iter()
        .map(|&n| {
            let ids = (0..n).map(|i| (100 + (i * 7919 + n * 131) % 40000) as u32).collect();
            (format!("len{n}"), ids)
        })
        .collect()
}

/// Builds the tiny model of `family` (f32) and records mlx-lm's outputs for
/// `ring_prompts()`, once per change of the scripts or prompts (cached under
/// target/oracle/kv_ring): tests/kv_ring.rs, and paging's sliding windows.
pub fn ring_oracle(family: &str) -> (PathBuf, PathBuf) {
    // Tests run in parallel and share the files.
    static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _once = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let dir = repo_root().join("target/oracle/kv_ring");
    std::fs::create_dir_all(&dir).unwrap();
    let folder = dir.join(format!("tiny-{family}"));
    let reference = dir.join(format!("tiny-{family}.reference.safetensors"));
    let prompts_file = dir.join("prompts.json");
    let list: Vec<_> = ring_prompts().into_iter().map(|(name, ids)| serde_json::json!({"name": name, "ids": ids})).collect();
    let text = serde_json::json!({ "prompts": list }).to_string();
    if std::fs::read_to_string(&prompts_file).ok().as_deref() != Some(text.as_str()) {
        std::fs::write(&prompts_file, &text).unwrap();
    }
    let scripts = repo_root().join("tests/oracle");
    let inputs = [scripts.join("make_tiny.py"), scripts.join("mlxlm_reference.py"), prompts_file.clone()];
    if !reference_fresh(&reference, &inputs) {
        let _ = std::fs::remove_dir_all(&folder);
        make_tiny(family, &folder, &[]);
        mlxlm_reference(&folder, &prompts_file, RING_STEPS, RING_LOGIT_STEPS, &reference, &[]);
    }
    (folder, reference)
}
