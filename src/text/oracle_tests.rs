//! Parity with the Python oracles in tests/oracle/ on the real SmolLM2 GGUF
//! (`MLXRT_MODEL`, default ~/.cache/mlxrt/models/...) and the project venv
//! (`MLXRT_VENV`, default ./.venv). A missing model or venv fails the test
//! with a message saying to run scripts/setup.sh, as in tests/common.

use super::*;
use crate::mlx::io::TensorFile;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

fn model_path() -> PathBuf {
    let path = std::env::var_os("MLXRT_MODEL").map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME").expect("HOME is set");
        PathBuf::from(home).join(".cache/mlxrt/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    });
    assert!(path.exists(), "model {} is missing: run scripts/setup.sh", path.display());
    path
}

fn python() -> PathBuf {
    let venv = std::env::var_os("MLXRT_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv"));
    let py = venv.join("bin/python");
    assert!(py.exists(), "{} is missing: run scripts/setup.sh", py.display());
    py
}

/// The vocabulary and tokenizer of the model file, loaded once per test run.
fn smollm() -> &'static (GgufVocab, Arc<Tokenizer>) {
    static LOADED: OnceLock<(GgufVocab, Arc<Tokenizer>)> = OnceLock::new();
    let path = model_path();
    LOADED.get_or_init(|| {
        let file = TensorFile::load_gguf(path.to_str().unwrap()).unwrap();
        let vocab = GgufVocab::from_tensor_file(&file).unwrap();
        let tokenizer = Tokenizer::from_gguf(&vocab).unwrap();
        (vocab, Arc::new(tokenizer))
    })
}

/// Runs tests/oracle/`script` on the model file and parses its JSON output.
fn oracle(script: &str) -> Value {
    let (model, py) = (model_path(), python());
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/oracle")
        .join(script);
    let out = Command::new(py).arg(&script).arg(&model).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} failed:\n{stderr}",
        script.display()
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn gguf_metadata_is_read() {
    let (v, t) = smollm();
    assert_eq!(
        (v.model.as_str(), v.pre.as_deref()),
        ("gpt2", Some("smollm"))
    );
    assert_eq!(
        (v.tokens.len(), v.merges.len(), v.token_types.len()),
        (49152, 48900, 49152)
    );
    assert_eq!(
        (v.bos_id, v.eos_id, v.pad_id, v.unk_id),
        (Some(1), Some(2), Some(2), Some(0))
    );
    assert!(!v.add_bos && !v.add_space_prefix);
    assert!(v.chat_template.as_deref().unwrap().contains("<|im_start|>"));
    // Known ids, by hand.
    assert_eq!(t.vocab_size(), 49152);
    assert_eq!(t.special_ids(), (0..17).collect::<Vec<u32>>());
    for (token, id) in [("<|endoftext|>", 0), ("<|im_start|>", 1), ("<|im_end|>", 2)] {
        assert_eq!(t.token_to_id(token), Some(id));
        assert_eq!(t.encode(token, true).unwrap(), vec![id]);
    }
    assert_eq!(
        (t.bos_id(), t.eos_id(), t.pad_id(), t.add_bos()),
        (Some(1), Some(2), Some(2), false)
    );
    let digits: Vec<u32> = "12345"
        .chars()
        .map(|c| t.token_to_id(&c.to_string()).unwrap())
        .collect();
    assert_eq!(t.encode("12345", false).unwrap(), digits);
}

#[test]
fn gguf_tokenizer_matches_python_tokenizers() {
    let ((v, t), out) = (smollm(), oracle("tokenizer_oracle.py"));
    let cases = out["cases"].as_array().unwrap();
    assert!(cases.len() > 10);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let (want, want_plain) = (ids(&case["ids"]), ids(&case["plain_ids"]));
        assert_eq!(t.encode(text, true).unwrap(), want, "ids of {text:?}");
        assert_eq!(
            t.encode(text, false).unwrap(),
            want_plain,
            "plain ids of {text:?}"
        );
        assert_eq!(
            t.decode(&want, false).unwrap(),
            case["decoded"].as_str().unwrap()
        );
        assert_eq!(
            t.decode(&want, true).unwrap(),
            case["decoded_skip"].as_str().unwrap()
        );
        assert_eq!(
            t.decode(&want_plain, true).unwrap(),
            text,
            "round trip of {text:?}"
        );
    }
    // The rendered prompt is the last case; our template renders it alike.
    let template = ChatTemplate::new(v.chat_template.as_deref().unwrap(), None, None).unwrap();
    let prompt = template.render(&out["messages"], None, true, None).unwrap();
    assert_eq!(prompt, out["prompt"].as_str().unwrap());
    assert_eq!(cases.last().unwrap()["text"], out["prompt"]);
}

#[test]
fn streaming_decode_equals_decode_on_real_vocab() {
    let (_, t) = smollm();
    let text = "emoji 🙂👍🏽 and 🇫🇷, 中文 café <|im_end|> done";
    let all = t.encode(text, true).unwrap();
    for emit_special in [false, true] {
        let mut dec = IncrementalDecoder::new(t.clone())
            .unwrap()
            .with_special_text(emit_special);
        let mut pieces: Vec<String> = all.iter().map(|&id| dec.push(id).unwrap()).collect();
        pieces.push(dec.finish());
        assert_eq!(pieces.concat(), t.decode(&all, !emit_special).unwrap());
        // Some token ended inside a character and was held back.
        let withheld = all
            .iter()
            .zip(&pieces)
            .any(|(&id, p)| p.is_empty() && !t.is_special(id));
        assert!(withheld, "no multi-byte character was split: {pieces:?}");
    }
}

#[test]
fn json_export_reloads_with_the_same_ids() {
    let (_, t) = smollm();
    let dir = std::env::temp_dir().join(format!("mlxrt-text-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), t.to_json_string().unwrap()).unwrap();
    let back = Tokenizer::from_file(&dir.join("tokenizer.json")).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let text = "<|im_start|>user\nCount 1 2 3, say «ok» 🙂<|im_end|>\n";
    assert_eq!(
        back.encode(text, true).unwrap(),
        t.encode(text, true).unwrap()
    );
    assert_eq!(back.special_ids(), t.special_ids());
}

#[test]
fn chat_templates_match_transformers() {
    let ((v, _), out) = (smollm(), oracle("template_oracle.py"));
    assert_eq!(
        out["templates"]["gguf"].as_str(),
        v.chat_template.as_deref()
    );
    let cases_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/template_cases.json");
    let cases: Value = serde_json::from_str(&std::fs::read_to_string(cases_path).unwrap()).unwrap();
    let results = out["results"].as_array().unwrap();
    assert_eq!(results.len(), cases.as_array().unwrap().len());
    for (i, (case, want)) in cases.as_array().unwrap().iter().zip(results).enumerate() {
        let source = out["templates"][case["template"].as_str().unwrap()]
            .as_str()
            .unwrap();
        let mut extra: Map<String, Value> = case["kwargs"].as_object().cloned().unwrap_or_default();
        let bos = extra.remove("bos_token");
        let eos = extra.remove("eos_token");
        let template = ChatTemplate::new(
            source,
            bos.as_ref().and_then(Value::as_str),
            eos.as_ref().and_then(Value::as_str),
        )
        .unwrap_or_else(|e| panic!("case {i}: {e}"));
        let tools = case.get("tools");
        let agp = case["add_generation_prompt"].as_bool().unwrap();
        let got = template.render(&case["messages"], tools, agp, Some(&extra));
        match (want["text"].as_str(), got) {
            (Some(want), Ok(got)) => assert_eq!(got, want, "case {i} ({})", case["template"]),
            (None, Err(TextError::TemplateRender(msg))) => {
                let want = want["error"].as_str().unwrap();
                assert!(msg.contains(want), "case {i}: {msg:?} lacks {want:?}");
            }
            (_, got) => panic!("case {i}: oracle {want}, ours {got:?}"),
        }
    }
}

/// `encode_split` tokenizes once and finds where a prefix of the text ends
/// in tokens: the same ids as `encode`, and the prefix's own token count
/// where the prefix ends on a token boundary (as a chat turn does).
#[test]
fn encode_split_finds_the_prefix_boundary() {
    let tok = &smollm().1;
    let head = "<|im_start|>system\nYou are kind.<|im_end|>\n<|im_start|>user\nHi, ça va?<|im_end|>\n";
    let full = format!("{head}<|im_start|>assistant\nOui!<|im_end|>\n<|im_start|>user\nEt toi?<|im_end|>\n");
    let (ids, within) = tok.encode_split(&full, head.len()).unwrap();
    assert_eq!(ids, tok.encode(&full, true).unwrap());
    assert_eq!(within, tok.encode(head, true).unwrap().len());
    assert!(within > 0 && within < ids.len());
    // A split inside a word counts only the tokens wholly before it.
    let (_, part) = tok.encode_split(&full, head.len() - "?<|im_end|>\n".len() - 2).unwrap();
    assert!(part < within, "{part} < {within}");
}
