//! Media tests shared by the families (tests/media*.rs): the oracle's cases
//! (tests/oracle/make_tiny_*.py reference files) and the engine-level checks
//! every vision-language checkpoint must pass.

use super::*;
use mlxrt::engine::{Engine, EngineConfig, Event, Input, RequestOptions};
use mlxrt::mlx::io::TensorFile;
use serde_json::{json, Value};
use std::path::Path;

/// The oracle's reference file in `dir`.
pub fn reference(dir: &Path) -> TensorFile {
    TensorFile::load_safetensors(dir.join("reference.safetensors").to_str().unwrap()).unwrap()
}

/// One prompt of the reference: its messages (image and audio parts
/// pointing at the oracle's files), ids, greedy tokens, logits of every
/// step, tower output.
pub struct MediaCase {
    pub name: String,
    pub messages: Value,
    /// The names of its images and audio clips, in document order per kind.
    pub images: Vec<String>,
    pub audio: Vec<String>,
    pub prompt: Vec<u32>,
    pub tokens: Vec<u32>,
    pub logits: Vec<Vec<f32>>,
    pub tower: Vec<f32>,
}

pub fn cases(dir: &Path) -> Vec<MediaCase> {
    let mut r = reference(dir);
    let mlxrt::mlx::io::Meta::Str(c) = r.meta("cases").unwrap().expect("cases metadata") else { panic!("cases") };
    let list: Vec<Value> = serde_json::from_str(&c).unwrap();
    list.into_iter()
        .map(|c| {
            let name = c["name"].as_str().unwrap().to_owned();
            let names = |k: &str| -> Vec<String> {
                c.get(k).and_then(Value::as_array).map_or(vec![], |a| a.iter().map(|v| v.as_str().unwrap().to_owned()).collect())
            };
            let (images, audio) = (names("images"), names("audio"));
            let file = |sub: &str, n: &str| {
                let p = std::fs::read_dir(dir.join(sub)).unwrap().map(|e| e.unwrap().path()).find(|p| p.file_stem().unwrap() == n).unwrap();
                p.to_str().unwrap().to_owned()
            };
            let (mut pics, mut clips) = (images.iter().map(|n| file("images", n)), audio.iter().map(|n| file("audio", n)));
            let mut messages = c["messages"].clone();
            for m in messages.as_array_mut().unwrap() {
                for part in m["content"].as_array_mut().unwrap() {
                    if part["type"] == "image" {
                        part["path"] = json!(pics.next().unwrap());
                    } else if part["type"] == "audio" {
                        part["path"] = json!(clips.next().unwrap());
                    }
                }
            }
            let ids = |k: &str, r: &mut TensorFile| r.take(&format!("{name}.{k}")).unwrap().to_vec_i32().unwrap().iter().map(|&t| t as u32).collect::<Vec<u32>>();
            let (prompt, tokens) = (ids("prompt_ids", &mut r), ids("tokens", &mut r));
            let l = r.take(&format!("{name}.logits")).unwrap();
            let v = l.shape()[1] as usize;
            let logits = l.to_vec_f32().unwrap().chunks(v).map(<[f32]>::to_vec).collect();
            let tower = r.take(&format!("{name}.tower")).unwrap().to_vec_f32().unwrap();
            MediaCase { name, messages, images, audio, prompt, tokens, logits, tower }
        })
        .collect()
}

/// `c`'s prompt through the model API with `media` spliced in, then greedy
/// decoding for as many steps as the oracle took: the tokens, and the max
/// |Δ| of every step's logits from the oracle's.
pub fn greedy_media(m: &mlxrt::model::LoadedModel, c: &MediaCase, media: &mlxrt::model::MediaInput) -> (Vec<u32>, f32) {
    use mlxrt::mlx::Array;
    use mlxrt::model::Output;
    let mut cache = m.model.new_cache(1);
    let ids: Vec<i32> = c.prompt.iter().map(|&t| t as i32).collect();
    let x = Array::from_i32(&ids, &[1, ids.len() as i32]).unwrap();
    let mut logits = m.model.forward_media(&x, media, &mut cache, Output::LastLogits).unwrap().unwrap().reshape(&[-1]).unwrap();
    let (mut worst, mut tokens) = (0f32, vec![]);
    for step in 0..c.tokens.len() {
        worst = worst.max(max_abs_diff(&logits.to_vec_f32().unwrap(), &c.logits[step]));
        let next = logits.argmax(-1, false).unwrap().item_i32().unwrap();
        tokens.push(next as u32);
        let x = Array::from_i32(&[next], &[1, 1]).unwrap();
        logits = m.model.forward(&x, &mut cache, Output::LastLogits).unwrap().unwrap().reshape(&[-1]).unwrap();
    }
    (tokens, worst)
}

/// A chat request of `steps` greedy tokens without EOS stop.
pub fn request(messages: Value, steps: u32) -> RequestOptions {
    let mut o = RequestOptions::new(Input::Messages(messages));
    o.max_tokens = steps;
    o.stop_at_eos = false;
    o
}

/// The engine: each image prompt alone gives mlx-vlm's tokens, and one
/// batched with text rows too (the text rows their own solo tokens). Repeated
/// images come from the encoder cache (the tower runs once per distinct image);
/// without it the tower runs for every image.
pub fn check_engine(dir: &Path, encoder_cache_bytes: usize) {
    let mut cfg = EngineConfig::new(dir.join("model"));
    cfg.max_rows = 4;
    cfg.encoder_cache_bytes = encoder_cache_bytes;
    let e = Engine::new(cfg).unwrap();
    let all = cases(dir);
    for c in &all {
        let ev = run(&e, request(c.messages.clone(), c.tokens.len() as u32));
        let Some(Event::Done { usage, .. }) = ev.last() else { panic!("{}: {ev:?}", c.name) };
        assert_eq!(usage.prompt_tokens as usize, c.prompt.len(), "{}: prompt length (expansion)", c.name);
        assert_eq!(tokens_of(&ev), c.tokens, "{}: engine tokens differ from mlx-vlm", c.name);
    }
    // Batched: a text request decoding while the image prompt prefills, and
    // another queued behind it.
    let text = |t: &str| request(json!([{"role": "user", "content": t}]), 24);
    let solo: Vec<Vec<u32>> = ["Tell me a long story about a cat.", "Hi"].iter().map(|t| tokens_of(&run(&e, text(t)))).collect();
    let c = &all[1];
    let rx_a = submit(&e, text("Tell me a long story about a cat."));
    let rx_m = submit(&e, request(c.messages.clone(), c.tokens.len() as u32));
    let rx_b = submit(&e, text("Hi"));
    assert_eq!(tokens_of(&collect(&rx_m)), c.tokens, "batched image prompt");
    assert_eq!(tokens_of(&collect(&rx_a)), solo[0], "text row batched with an image prompt");
    assert_eq!(tokens_of(&collect(&rx_b)), solo[1], "text row queued behind an image prompt");
    let s = wait_idle(&e);
    let images: Vec<&String> = all.iter().flat_map(|c| c.images.iter().chain(&c.audio)).chain(c.images.iter().chain(&c.audio)).collect();
    let mut distinct = images.clone();
    distinct.sort();
    distinct.dedup();
    eprintln!("{} images, {} distinct: tower runs {}, encoder cache hits {}", images.len(), distinct.len(), s.tower_runs, s.encoder_cache_hits);
    if encoder_cache_bytes > 0 {
        assert_eq!((s.tower_runs as usize, s.encoder_cache_hits as usize), (distinct.len(), images.len() - distinct.len()));
    } else {
        assert_eq!((s.tower_runs as usize, s.encoder_cache_hits), (images.len(), 0));
    }
}

/// Runs a case on `e`: its tokens, the prompt tokens the prompt cache
/// supplied, and the engine's tower runs so far.
pub fn go(e: &Engine, c: &MediaCase) -> (Vec<u32>, usize, u64) {
    let ev = run(e, request(c.messages.clone(), c.tokens.len() as u32));
    let Some(Event::Done { usage, .. }) = ev.last() else { panic!("{}: {ev:?}", c.name) };
    (tokens_of(&ev), usage.cached_tokens as usize, wait_idle(e).tower_runs)
}

/// An engine on the tiny checkpoint whose prompt cache takes these short
/// prompts, without the encoder cache (so that only the prompt cache can
/// skip the tower).
pub fn caching_engine(dir: &Path, disk: Option<&Path>) -> Engine {
    let mut cfg = EngineConfig::new(dir.join("model"));
    cfg.prompt_cache_min_tokens = 8;
    cfg.encoder_cache_bytes = 0;
    cfg.prompt_cache_dir = disk.map(std::path::Path::to_path_buf);
    Engine::new(cfg).unwrap()
}

pub fn one_and_other(all: &[MediaCase]) -> (&MediaCase, &MediaCase) {
    let (one, other) = (all.iter().find(|c| c.name == "one_png").unwrap(), all.iter().find(|c| c.name == "other_png").unwrap());
    assert_eq!(one.prompt, other.prompt, "the two cases differ only in their image");
    (one, other)
}

/// Where the first image soft token of `prompt` is (the checkpoint's
/// `image_token_id` / `image_token_index`): a hit for another image must stop
/// there.
fn first_image_token(dir: &Path, prompt: &[u32]) -> usize {
    let config: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("model/config.json")).unwrap()).unwrap();
    let soft = config.get("image_token_id").or(config.get("image_token_index")).and_then(Value::as_u64).unwrap() as u32;
    prompt.iter().position(|&t| t == soft).unwrap()
}

/// Prefix identity: the prompt cache keys media prompts by their images'
/// content, so the same image and text hit (all but the last token, no tower
/// run, the same tokens) and the same text with another image does not (at
/// most the text before the image, where the cache can cut an entry back).
pub fn check_prefix_identity(dir: &Path) {
    let e = caching_engine(dir, None);
    let all = cases(dir);
    let (one, other) = one_and_other(&all);
    let (t, cached, runs) = go(&e, one);
    assert_eq!((t.as_slice(), cached, runs), (one.tokens.as_slice(), 0, 1), "cold");
    let (t, cached, runs) = go(&e, one);
    assert_eq!((t.as_slice(), cached, runs), (one.tokens.as_slice(), one.prompt.len() - 1, 1), "same image and text: a hit, no tower run");
    let (t, cached, runs) = go(&e, other);
    assert_eq!((t.as_slice(), runs), (other.tokens.as_slice(), 2), "same text, another image: the tower runs");
    let first = first_image_token(dir, &other.prompt);
    assert!(cached <= first, "same text, another image: {cached} cached tokens reach into the image (it starts at {first})");
}

/// The same from the disk tier: after a restart on the same prompt-cache
/// directory, the same text with another image misses, and the same image
/// and text hit without running the tower and give the same tokens.
pub fn check_prefix_identity_on_disk(dir: &Path) {
    let disk = std::env::temp_dir().join(format!("mlxrt-media-disk-{}-{}", dir.file_name().unwrap().to_str().unwrap(), std::process::id()));
    let _ = std::fs::remove_dir_all(&disk);
    let all = cases(dir);
    let (one, other) = one_and_other(&all);
    {
        let e = caching_engine(dir, Some(&disk));
        let (t, cached, runs) = go(&e, one);
        assert_eq!((t.as_slice(), cached, runs), (one.tokens.as_slice(), 0, 1), "cold");
        e.flush_prompt_cache().unwrap();
        assert!(wait_idle(&e).prompt_cache_disk_bytes > 0, "the entry is on disk");
    }
    let e = caching_engine(dir, Some(&disk));
    let (t, cached, runs) = go(&e, other);
    assert_eq!((t.as_slice(), runs), (other.tokens.as_slice(), 1), "after a restart, another image: the tower runs");
    assert!(cached <= first_image_token(dir, &other.prompt), "after a restart, another image: {cached} cached tokens reach into the image");
    let (t, cached, runs) = go(&e, one);
    assert_eq!((t.as_slice(), cached, runs), (one.tokens.as_slice(), one.prompt.len() - 1, 1), "after a restart, the same image and text: a disk hit, no tower run");
    drop(e);
    let _ = std::fs::remove_dir_all(&disk);
}
