//! scripts/bench.sh speculative: decode speed with and without prompt-lookup
//! speculation on an input-grounded task (rewrite a ~400-token code snippet
//! with one variable renamed, output the whole code), greedy. Both ways must
//! give the same tokens (asserted). After an untimed warm-up of each, ABBA
//! rounds (A = plain, B = n-gram); figures are medians over the runs.
//!
//!   MLXRT_BENCH_KERNELS=auto|stock [MLXRT_DRAFT_MODEL=DRAFT] mlxrt_speculative MODEL OUT_JSON [ROUNDS] [NUM_TOKENS]
//!
//! `ngram_speedup` = median decode tok/s with lookup ÷ median without
//! (decode tok/s = (completion tokens − 1) ÷ first-to-last-token time, so
//! prefill is excluded on both sides); also the median of the per-round
//! ratios, acceptance rate (accepted ÷ proposed drafts), accepted drafts and
//! emitted tokens per verify step.
//!
//! With `MLXRT_DRAFT_MODEL`: `draft_speedup` the same way on a chat task
//! (a few chat prompts, 128 tokens each, greedy, EOS ignored), plain (A)
//! against the draft model drafting 3 tokens per verify step (B), ABBA
//! rounds over all prompts, same tokens asserted.

use mlxrt::engine::{Engine, EngineConfig, Event, Input, RequestOptions, Speculation, Usage};
use serde_json::json;
use std::sync::mpsc;

#[path = "provenance.rs"]
mod provenance;

const CODE: &str = r#"import json
from dataclasses import dataclass, field


@dataclass
class Order:
    order_id: str
    items: list = field(default_factory=list)
    discount: float = 0.0

    def subtotal(self):
        result = 0.0
        for item in self.items:
            result += item["price"] * item["quantity"]
        return result

    def total(self):
        result = self.subtotal()
        if self.discount > 0:
            result = result * (1.0 - self.discount)
        return round(result, 2)


def load_orders(path):
    with open(path) as handle:
        records = json.load(handle)
    orders = []
    for record in records:
        order = Order(record["id"], record.get("items", []), record.get("discount", 0.0))
        orders.append(order)
    return orders


def summarize(orders):
    result = {"count": len(orders), "revenue": 0.0, "largest": None}
    for order in orders:
        value = order.total()
        result["revenue"] += value
        if result["largest"] is None or value > result["largest"][1]:
            result["largest"] = (order.order_id, value)
    result["revenue"] = round(result["revenue"], 2)
    return result


if __name__ == "__main__":
    orders = load_orders("orders.json")
    result = summarize(orders)
    print(json.dumps(result, indent=2))
"#;

fn request(spec: Speculation, max_tokens: u32) -> RequestOptions {
    let user = format!(
        "Rewrite this Python code, renaming the variable `result` to `acc` everywhere. Output the whole code and nothing else.\n\n```python\n{CODE}```"
    );
    let mut o = RequestOptions::new(Input::Messages(json!([{"role": "user", "content": user}])));
    o.max_tokens = max_tokens;
    o.prompt_cache = false;
    o.speculation = Some(spec);
    o
}

/// The draft-model task: short chat answers (nothing to copy from the prompt).
const CHAT: [&str; 4] = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a refrigerator keeps food cold, step by step.",
    "Give me five tips for learning a new language, with a sentence on each.",
    "Describe a walk through a forest in autumn.",
];
const CHAT_TOKENS: u32 = 128;

fn chat_request(user: &str, spec: Speculation) -> RequestOptions {
    let mut o = RequestOptions::new(Input::Messages(json!([{"role": "user", "content": user}])));
    o.max_tokens = CHAT_TOKENS;
    o.stop_at_eos = false;
    o.prompt_cache = false;
    o.speculation = Some(spec);
    o
}

/// Draft-model speculation against plain decoding on the chat task: the
/// JSON fields it adds.
fn draft_bench(model: &str, draft: &str, rounds: usize) -> serde_json::Value {
    let mut cfg = EngineConfig::new(model);
    cfg.kernels = provenance::kernels();
    cfg.prompt_cache_bytes = 0;
    cfg.draft_model_path = Some(draft.into());
    let e = Engine::new(cfg).expect("engine with the draft model");
    let (plain, spec) = (Speculation::Off, Speculation::Draft { num_tokens: 3 });
    let reference: Vec<Vec<u32>> = CHAT.iter().map(|q| run(&e, chat_request(q, plain)).1).collect();
    for (q, r) in CHAT.iter().zip(&reference) {
        assert_eq!(&run(&e, chat_request(q, spec)).1, r, "draft-speculative greedy tokens differ from plain decoding");
    }
    let (mut a, mut b, mut ratios) = (vec![], vec![], vec![]);
    let (mut proposed, mut accepted, mut verifies) = (0u64, 0u64, 0u64);
    for r in 0..rounds {
        let mut round = [0.0f64; 2];
        for s in [plain, spec, spec, plain] {
            // One figure per pass: tokens over decode time, all prompts.
            let (mut tokens, mut secs) = (0.0, 0.0);
            for (q, reference) in CHAT.iter().zip(&reference) {
                let (u, got) = run(&e, chat_request(q, s));
                assert_eq!(&got, reference, "round {r}: tokens differ");
                tokens += (u.completion_tokens.saturating_sub(1)) as f64;
                secs += (u.completion_tokens.saturating_sub(1)) as f64 / u.decode_tokens_per_s.max(1e-9);
                if s == spec {
                    (proposed, accepted, verifies) =
                        (proposed + u.spec_proposed as u64, accepted + u.spec_accepted as u64, verifies + u.spec_verify_steps as u64);
                }
            }
            let tps = tokens / secs;
            eprintln!("draft round {r} {}: {tps:.1} tok/s", if s == plain { "A" } else { "B" });
            let (list, i) = if s == plain { (&mut a, 0) } else { (&mut b, 1) };
            list.push(tps);
            round[i] += tps / 2.0;
        }
        ratios.push(round[1] / round[0]);
    }
    let (ma, mb) = (median(&a), median(&b));
    json!({
        "draft_task": "chat: 4 prompts (story, explanation, tips, description), 128 tokens each, greedy, EOS ignored",
        "draft_pair": {"target": model, "draft": draft, "note": "SmolLM2-135M Q4_1 drafted by the same model requantized to Q4_0: \
            no smaller model with the same tokenizer is installable here, \
            so the draft costs as much as the target and a speedup below 1 is expected"},
        "draft_num_tokens": 3,
        "draft_order": "ABBA per round (A = plain, B = draft model), each pass over all prompts, after one untimed run of each",
        "draft_plain_decode_tps": a,
        "draft_decode_tps": b,
        "draft_plain_decode_tps_median": ma,
        "draft_decode_tps_median": mb,
        "draft_speedup": mb / ma,
        "draft_speedup_per_round_median": median(&ratios),
        "draft_acceptance_rate": accepted as f64 / proposed.max(1) as f64,
        "draft_accepted_per_verify": accepted as f64 / verifies.max(1) as f64,
        "draft_tokens_per_verify_step": (accepted + verifies) as f64 / verifies.max(1) as f64,
    })
}

fn run(e: &Engine, o: RequestOptions) -> (Usage, Vec<u32>) {
    let (tx, rx) = mpsc::channel();
    e.submit(o, Box::new(move |ev: &Event| {
        let _ = tx.send(ev.clone());
    }))
    .expect("submit");
    let mut tokens = vec![];
    for ev in rx.iter() {
        match ev {
            Event::Delta { tokens: t, .. } => tokens.extend(t),
            Event::Done { usage, .. } => return (usage, tokens),
            Event::Error(err) => panic!("request failed: {err}"),
            Event::ToolCall { .. } => {}
        }
    }
    panic!("no terminal event")
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: {} MODEL OUT_JSON [ROUNDS] [NUM_TOKENS]", args[0]);
        std::process::exit(2);
    }
    let rounds: usize = args.get(3).map_or(3, |r| r.parse().expect("ROUNDS"));
    let gamma: usize = args.get(4).map_or(10, |r| r.parse().expect("NUM_TOKENS"));
    let max_tokens = 700;
    let mut cfg = EngineConfig::new(&args[1]);
    cfg.kernels = provenance::kernels();
    cfg.prompt_cache_bytes = 0;
    let e = Engine::new(cfg).expect("engine");
    let draft = std::env::var("MLXRT_DRAFT_MODEL").ok().filter(|d| !d.is_empty());
    let loadavg = || std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim().to_string();
    let load_before = loadavg();
    let (plain, ngram) = (Speculation::Off, Speculation::Ngram { num_tokens: gamma, min_match: 2 });

    let (_, reference) = run(&e, request(plain, max_tokens));
    let (_, warm) = run(&e, request(ngram, max_tokens));
    assert_eq!(warm, reference, "speculative greedy tokens differ from plain decoding");
    let prompt_tokens = e.prepare(request(plain, max_tokens)).expect("prepare").prompt_tokens().len();

    let (mut a, mut b, mut ratios) = (vec![], vec![], vec![]);
    let (mut proposed, mut accepted, mut verifies) = (0u64, 0u64, 0u64);
    for r in 0..rounds {
        let mut round = [0.0f64; 2];
        for (i, spec) in [plain, ngram, ngram, plain].into_iter().enumerate() {
            let (u, tokens) = run(&e, request(spec, max_tokens));
            assert_eq!(tokens, reference, "round {r} run {i}: tokens differ");
            let tps = u.decode_tokens_per_s;
            eprintln!("round {r} {}: {tps:.1} tok/s ({} tokens, {} verify steps)", if spec == plain { "A" } else { "B" }, tokens.len(), u.spec_verify_steps);
            if spec == plain {
                a.push(tps);
                round[0] += tps / 2.0;
            } else {
                b.push(tps);
                round[1] += tps / 2.0;
                (proposed, accepted, verifies) =
                    (proposed + u.spec_proposed as u64, accepted + u.spec_accepted as u64, verifies + u.spec_verify_steps as u64);
            }
        }
        ratios.push(round[1] / round[0]);
    }
    let (ma, mb) = (median(&a), median(&b));
    let runs = 2 * rounds as u64;
    // Both sides are this engine: speculation on (mlxrt) and off (reference).
    let prov = provenance::json(provenance::kernels());
    let mut plain_side = prov.clone();
    plain_side["side"] = json!("mlxrt plain decoding (same engine and run, speculation off)");
    drop(e);
    let draft_fields = match &draft {
        Some(d) => draft_bench(&args[1], d, rounds),
        None => json!({"draft_speedup": null, "draft_note": "MLXRT_DRAFT_MODEL not set: draft-model speculation not measured"}),
    };
    let mut out = json!({
        "benchmark": "speculative",
        "task": "rewrite a Python snippet with one variable renamed, whole code out (chat template, greedy, EOS on)",
        "model": args[1],
        "prompt_tokens": prompt_tokens,
        "output_tokens": reference.len(),
        "same_tokens_both_ways": true,
        "num_tokens": gamma,
        "min_match": 2,
        "rounds": rounds,
        "order": "ABBA per round (A = plain, B = prompt lookup), after one untimed run of each",
        "plain_decode_tps": a,
        "ngram_decode_tps": b,
        "plain_decode_tps_median": ma,
        "ngram_decode_tps_median": mb,
        "ngram_speedup": mb / ma,
        "ngram_speedup_per_round_median": median(&ratios),
        "acceptance_rate": accepted as f64 / proposed.max(1) as f64,
        "accepted_per_verify": accepted as f64 / verifies.max(1) as f64,
        "tokens_per_verify_step": (accepted + verifies) as f64 / verifies.max(1) as f64,
        "verify_steps_per_run": verifies as f64 / runs as f64,
        "proposed_per_run": proposed as f64 / runs as f64,
        "host_load_average": {"before": load_before, "after": loadavg(), "cpus": std::thread::available_parallelism().map_or(0, |n| n.get())},
        "provenance": {"mlxrt": prov, "reference": plain_side},
    });
    if let (Some(o), Some(d)) = (out.as_object_mut(), draft_fields.as_object()) {
        o.extend(d.clone());
    }
    let text = serde_json::to_string_pretty(&out).unwrap();
    std::fs::write(&args[2], format!("{text}\n")).expect("write results");
    println!("{text}");
}
