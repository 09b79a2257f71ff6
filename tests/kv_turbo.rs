//! TurboQuant KV (issue 11) end to end on SmolLM2 (the default GGUF; head_dim
//! 64, 3 KV heads, 30 layers): next-token KL divergence against the
//! unquantized cache, teacher-forced over a 526-token text (also for the
//! decode path), and batched rows against the same rows alone.
//!
//! Needs the default model (scripts/setup.sh).
//!
//! The codec itself (formulas, reconstruction error against theory) is tested
//! in src/cache/turbo.rs.

mod common;

use common::*;
use mlxrt::cache::scheme::{KvQuant, KvScheme};
use mlxrt::cache::{KvCache, LayerCache};
use mlxrt::engine::{Engine, EngineConfig, Event, Input, RequestOptions};
use mlxrt::mlx::{self, Array};
use mlxrt::model::{load, LoadOptions, LoadedModel, Output};
use std::sync::mpsc;

const K8V3: KvScheme = KvScheme::TurboQuant { key_bits: 8, value_bits: 3 };
const AFFINE4: KvScheme = KvScheme::Affine { bits: 4, group_size: 64 };

/// An English text of 526 SmolLM2 tokens (plain prose: no code or markup).
const TEXT: &str = "The lighthouse stood at the end of a narrow spit of rock, and for most of the year \
nobody came to it except the keeper, the supply boat, and the weather. The keeper was a careful man who \
wrote everything down. Each morning he recorded the direction of the wind, the height of the swell, the \
colour of the sky at dawn and the number of ships that had passed in the night. He did not think of \
these notes as a diary; they were measurements, and measurements, he believed, were the only honest way \
to speak about the sea. Still, over the years the notebooks began to tell a story of their own. In the \
early volumes the handwriting was small and hurried, as if the writer expected to be interrupted. Later \
it grew larger and calmer. The entries became longer, too. Beside the wind and the swell he began to \
note which birds had arrived, when the first storm of autumn broke, how long the ice stayed in the \
harbour, and whether the supply boat was late. When the boat was late he wrote down what he had eaten \
instead, which was usually fish, and what he had read, which was usually the same three books. One \
winter the lamp failed. A part in the clockwork that turned the great lens had worn through, and the \
spare had been sent to the wrong harbour. For eleven nights the keeper turned the lens by hand, \
walking in a slow circle at the top of the tower from dusk until dawn, counting his steps so that the \
flashes would keep their proper rhythm. Ships at sea saw nothing unusual. The notebooks for those \
eleven nights contain only numbers: the hours, the steps, the flashes, the wind. On the twelfth day \
the part arrived, and the keeper fitted it, wound the clock, and slept for fourteen hours. When the \
lighthouse was finally automated, many years later, the engineers who came to install the new equipment \
found the notebooks stacked in a cupboard beneath the stairs, nearly forty of them, tied with string. \
They read a few pages out of curiosity and then, without quite deciding to, read all of them. One of \
the engineers later said that she had learned more about the sea from those plain columns of numbers \
than from anything else she had ever studied, because every number had been written by someone who \
was there, awake, paying attention, night after night, with no one watching and no reason to pretend. \
The notebooks are now kept in a small museum in the town across the bay, in a glass case near the \
window, where on clear nights you can still see the light turning at the end of the rock.";

fn model() -> LoadedModel {
    load(&model_path(), &LoadOptions { cpu_f32_scales: true, ..LoadOptions::default() }).unwrap()
}

/// A one-row cache with the full-attention layers stored as `scheme` from
/// position 0.
fn cache(m: &LoadedModel, scheme: KvScheme) -> Vec<LayerCache> {
    let mut cache = m.model.new_cache(1);
    for (c, l) in cache.iter_mut().zip(m.model.kv_layers()) {
        if l.is_some_and(|l| l.window.is_none()) {
            let mut kv = KvCache::with_scheme(1, scheme).unwrap();
            kv.set_starts(&[0]);
            *c = LayerCache::Kv(kv);
        }
    }
    cache
}

/// Log-probabilities `[n, vocab]` of every next token, the whole text in one
/// forward pass (so every position attends to quantized KV from the first).
fn log_probs(m: &LoadedModel, ids: &[i32], scheme: KvScheme) -> Array {
    let mut c = cache(m, scheme);
    let x = Array::from_i32(ids, &[1, ids.len() as i32]).unwrap();
    let logits = m.model.forward(&x, &mut c, Output::AllLogits).unwrap().unwrap().squeeze(0).unwrap();
    logits.subtract(&logits.logsumexp(-1, true).unwrap()).unwrap()
}

/// Per position: KL(p ‖ q) and whether the top tokens agree.
fn kl(p: &Array, q: &Array) -> (Vec<f32>, f32) {
    let kl = p.exp().unwrap().multiply(&p.subtract(q).unwrap()).unwrap().sum(-1, false).unwrap();
    let same = p.argmax(-1, false).unwrap().equal(&q.argmax(-1, false).unwrap()).unwrap();
    let same = same.astype(mlx::Dtype::F32).unwrap().mean(0, false).unwrap().item_f32().unwrap();
    (kl.to_vec_f32().unwrap(), same)
}

fn summary(kl: &[f32]) -> (f32, f32) {
    (kl.iter().sum::<f32>() / kl.len() as f32, kl.iter().copied().fold(0.0, f32::max))
}

/// Mean KL per token of k8v3 must stay under `MEAN_KL_BOUND` nats and under
/// that of 4-bit affine KV (g64, mlx-lm's `kv_bits=4`), which takes a similar
/// number of bytes (0.31 of f16 against k8v3's 0.39). Measured on this text
/// (526 tokens): k8v3 mean 0.021, max 0.14, top-1 agreement 91%; affine
/// 4-bit mean 0.125, max 1.6, 78%. The bound is about 2.4× the measured mean:
/// room for other summation orders, while 2-bit values (k8v2, mean ≈ 0.13
/// on another text) or any codec defect lands far above it.
const MEAN_KL_BOUND: f32 = 0.05;

#[test]
fn k8v3_next_token_kl_on_smollm2() {
    let m = model();
    let ids: Vec<i32> = m.text.tokenizer.encode(TEXT, false).unwrap().iter().map(|&t| t as i32).collect();
    assert!((480..=600).contains(&ids.len()), "the text is {} tokens", ids.len());
    let dense = log_probs(&m, &ids, KvScheme::Dense);
    let (turbo, same) = kl(&dense, &log_probs(&m, &ids, K8V3));
    let (affine, affine_same) = kl(&dense, &log_probs(&m, &ids, AFFINE4));
    let ((tm, tx), (am, ax)) = (summary(&turbo), summary(&affine));
    eprintln!("{} tokens, KL(dense ‖ scheme) per token, start 0:", ids.len());
    eprintln!("  turboquant k8v3: mean {tm:.4} max {tx:.3} nats, top-1 agreement {:.1}%", same * 100.0);
    eprintln!("  affine 4-bit g64: mean {am:.4} max {ax:.3} nats, top-1 agreement {:.1}%", affine_same * 100.0);
    assert!(turbo.iter().all(|k| k.is_finite() && *k > -1e-4), "KL must be finite and non-negative");
    assert!(tm <= MEAN_KL_BOUND, "k8v3 mean KL {tm} > {MEAN_KL_BOUND}");
    assert!(tm < am, "k8v3 mean KL {tm} not below affine 4-bit's {am}");
    assert!(same >= 0.8, "top-1 agreement {same}");
}

#[test]
fn decode_steps_stay_close_to_dense() {
    // The decode path (one query, no mask) after a prefill: its next-token
    // distributions against the dense cache's are as close as the prefill
    // path's (same bound). It does not equal the prefill path bit for bit:
    // BLAS sums a one-query product in another order than a many-query one,
    // and such a rounding difference moves the odd key or value to the
    // neighbouring level when the next layer quantizes it (the log reports
    // the largest |Δ log p| between the two paths; dense KV gives ~1e-5).
    let m = model();
    let ids: Vec<i32> = m.text.tokenizer.encode(TEXT, false).unwrap().iter().map(|&t| t as i32).take(200).collect();
    let split = 150;
    let dense = log_probs(&m, &ids, KvScheme::Dense);
    let prefill = log_probs(&m, &ids, K8V3);
    let mut c = cache(&m, K8V3);
    let x = Array::from_i32(&ids[..split], &[1, split as i32]).unwrap();
    m.model.forward(&x, &mut c, Output::CacheOnly).unwrap();
    let mut steps = vec![];
    for &t in &ids[split..] {
        let x = Array::from_i32(&[t], &[1, 1]).unwrap();
        let l = m.model.forward(&x, &mut c, Output::LastLogits).unwrap().unwrap().reshape(&[1, -1]).unwrap();
        steps.push(l.subtract(&l.logsumexp(-1, true).unwrap()).unwrap());
    }
    let decoded = Array::concatenate(&steps.iter().collect::<Vec<_>>(), 0).unwrap();
    let tail = |a: &Array| a.slice_axis(0, split as i32, ids.len() as i32).unwrap();
    let (kl_decode, same) = kl(&tail(&dense), &decoded);
    let (kl_prefill, _) = kl(&tail(&dense), &tail(&prefill));
    let ((dm, dx), (pm, px)) = (summary(&kl_decode), summary(&kl_prefill));
    let gap = decoded.subtract(&tail(&prefill)).unwrap().abs().unwrap().max(-1, false).unwrap().max(0, false).unwrap().item_f32().unwrap();
    eprintln!("{} decode steps, KL(dense ‖ k8v3): decode path mean {dm:.4} max {dx:.3}, prefill path mean {pm:.4} max {px:.3}; top-1 agreement {:.1}%; max |Δ log p| decode vs prefill {gap:.2e}", ids.len() - split, same * 100.0);
    assert!(kl_decode.iter().all(|k| k.is_finite()), "KL must be finite");
    assert!(dm <= MEAN_KL_BOUND, "decode path mean KL {dm} > {MEAN_KL_BOUND}");
}

fn request(prompt: &[u32], start: i32, chunk: Option<usize>) -> RequestOptions {
    let mut o = RequestOptions::new(Input::Tokens(prompt.to_vec()));
    o.max_tokens = 12;
    o.stop_at_eos = false;
    o.prefill_chunk = chunk;
    o.quantized_kv_start = Some(start);
    o
}

fn turbo_engine(max_rows: usize) -> Engine {
    let mut cfg = EngineConfig::new(&model_path());
    cfg.max_rows = max_rows;
    cfg.prefill_chunk = 16;
    cfg.prompt_cache_bytes = 0;
    cfg.kv = KvQuant { scheme: K8V3, start: 0, ..KvQuant::default() };
    Engine::new(cfg).unwrap()
}

#[test]
fn batched_rows_equal_rows_alone() {
    // Rows of different lengths and starts (0, during prefill, during
    // decode), all submitted at once, with chunks that do not divide the
    // starts: each row's greedy tokens are those it gets alone.
    let m = model();
    let ids = m.text.tokenizer.encode(TEXT, false).unwrap();
    drop(m);
    let rows: Vec<(Vec<u32>, i32)> =
        vec![(ids[..70].to_vec(), 24), (ids[100..105].to_vec(), 0), (ids[200..237].to_vec(), 40), (ids[300..316].to_vec(), 7)];
    let alone_engine = turbo_engine(1);
    let alone: Vec<Vec<u32>> = rows.iter().map(|(p, s)| tokens_of(&run(&alone_engine, request(p, *s, None)))).collect();
    drop(alone_engine);
    let e = turbo_engine(4);
    assert_eq!(e.info().kv_scheme, "turboquant:k8v3");
    for chunk in [None, Some(5)] {
        let rxs: Vec<_> = rows
            .iter()
            .map(|(p, s)| {
                let (tx, rx) = mpsc::channel();
                e.submit(request(p, *s, chunk), Box::new(move |ev: &Event| {
                    let _ = tx.send(ev.clone());
                }))
                .unwrap();
                rx
            })
            .collect();
        for (i, rx) in rxs.iter().enumerate() {
            let got = tokens_of(&collect(rx));
            assert_eq!(got, alone[i], "row {i} (start {}), chunk {chunk:?}: batched differs from alone", rows[i].1);
        }
    }
    let stats = wait_idle(&e);
    assert_eq!(stats.kv_bytes, 0, "no KV held once idle");
}
