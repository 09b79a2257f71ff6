//! Structured output (`response_format`) on the real default model: every
//! constrained output is a complete, valid document (checked with an
//! independent validator, the `jsonschema` crate), regex and Lark outputs
//! match, bad constraints fail at submit, and constrained rows batch with
//! free ones without changing anyone's tokens.

mod common;

use common::*;
use mlxrt::engine::{Event, FinishReason, RequestOptions};
use mlxrt::grammar::ResponseFormat;
use mlxrt::ErrorKind;
use serde_json::{json, Value};
use std::path::PathBuf;

fn schemas() -> Vec<(String, String, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schemas");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            (name, v["prompt"].as_str().unwrap().to_owned(), v["schema"].clone())
        })
        .collect()
}

fn constrained(user: &str, format: Value, max_tokens: u32) -> RequestOptions {
    let mut o = chat(&format!("{user} Reply in JSON."));
    o.apply_json(&json!({"response_format": format, "max_tokens": max_tokens}).to_string()).unwrap();
    o
}

fn finish_of(ev: &[Event]) -> FinishReason {
    match ev.last() {
        Some(Event::Done { finish, .. }) => *finish,
        other => panic!("no Done: {other:?}"),
    }
}

/// The 30 schemas run as concurrent requests (one decode batch): each
/// output ends with STOP and is valid JSON that the schema accepts.
#[test]
fn thirty_schemas_give_valid_documents() {
    let e = engine();
    let cases = schemas();
    assert_eq!(cases.len(), 30);
    let rx: Vec<_> = cases
        .iter()
        .map(|(_, prompt, schema)| submit(&e, constrained(prompt, json!({"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}), 96)))
        .collect();
    let mut failures = vec![];
    for ((name, _, schema), rx) in cases.iter().zip(&rx) {
        let ev = collect(rx);
        let text = text_of(&ev);
        let finish = finish_of(&ev);
        let validator = jsonschema::validator_for(schema).unwrap_or_else(|e| panic!("{name}: the validator rejects the schema: {e}"));
        match serde_json::from_str::<Value>(&text) {
            Ok(doc) if finish == FinishReason::Stop && validator.is_valid(&doc) => {}
            Ok(doc) => failures.push(format!("{name}: {finish:?}, valid={}: {text}", validator.is_valid(&doc))),
            Err(err) => failures.push(format!("{name}: {finish:?}, not JSON ({err}): {text:?}")),
        }
    }
    assert!(failures.is_empty(), "{} of 30 invalid:\n{}", failures.len(), failures.join("\n"));
}

/// `json_object`, the short schema form, a regex and a Lark grammar; a
/// finished document ends the stream even with `ignore_eos`; a budget too
/// small for the document ends with LENGTH.
#[test]
fn json_object_regex_lark_and_finish_reasons() {
    let e = engine();
    let ev = run(&e, constrained("Give a JSON object with the key \"ok\" set to true.", json!({"type": "json_object"}), 48));
    let doc: Value = serde_json::from_str(&text_of(&ev)).unwrap_or_else(|err| panic!("{err}: {ev:?}"));
    assert!(doc.is_object(), "{doc}");
    assert_eq!(finish_of(&ev), FinishReason::Stop);

    let mut o = constrained("How many legs does a cat have?", json!({"type": "json_schema", "schema": {"type": "integer", "minimum": 0, "maximum": 9}}), 16);
    o.stop_at_eos = false;
    let ev = run(&e, o);
    let n: i64 = text_of(&ev).parse().unwrap_or_else(|err| panic!("{err}: {ev:?}"));
    assert!((0..=9).contains(&n));
    assert_eq!(finish_of(&ev), FinishReason::Stop, "a complete document ends the stream despite ignore_eos");

    let ev = run(&e, constrained("Give a phone number.", json!({"type": "regex", "pattern": "[0-9]{3}-[0-9]{4}"}), 16));
    let t = text_of(&ev);
    let b = t.as_bytes();
    assert!(b.len() == 8 && b[3] == b'-' && b.iter().enumerate().all(|(i, c)| i == 3 || c.is_ascii_digit()), "{t:?}");
    assert_eq!(finish_of(&ev), FinishReason::Stop);

    let lark = "start: greeting \" \" name \"!\"\ngreeting: \"Hello\" | \"Hi\"\nname: /[A-Z][a-z]{1,8}/\n";
    let ev = run(&e, constrained("Greet Bob.", json!({"type": "grammar", "lark": lark}), 16));
    let t = text_of(&ev);
    let rest = t.strip_prefix("Hello ").or_else(|| t.strip_prefix("Hi ")).unwrap_or_else(|| panic!("{t:?}"));
    let name = rest.strip_suffix('!').unwrap_or_else(|| panic!("{t:?}"));
    assert!(name.len() >= 2 && name.len() <= 9 && name.as_bytes()[0].is_ascii_uppercase(), "{t:?}");
    assert!(name[1..].bytes().all(|c| c.is_ascii_lowercase()), "{t:?}");
    assert_eq!(finish_of(&ev), FinishReason::Stop);

    let schema = json!({"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]});
    let ev = run(&e, constrained("Tell a long story.", json!({"type": "json_schema", "schema": schema}), 4));
    assert_eq!(finish_of(&ev), FinishReason::Length);
    assert!(text_of(&ev).starts_with("{\""), "{ev:?}");
}

/// A schema, regex or grammar that cannot be compiled is INVALID_ARGUMENT
/// at submit, with the compiler's message.
#[test]
fn invalid_constraints_fail_at_submit() {
    let e = engine();
    for (format, says) in [
        (json!({"type": "json_schema", "schema": {"type": "frobnicate"}}), "frobnicate"),
        (json!({"type": "json_schema", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}), ""),
        (json!({"type": "regex", "pattern": "(unclosed"}), ""),
        (json!({"type": "grammar", "lark": "start: missing_rule"}), "missing_rule"),
    ] {
        let o = constrained("Hi", format.clone(), 8);
        let err = e.submit(o, Box::new(|_: &Event| {})).err().unwrap_or_else(|| panic!("accepted {format}"));
        assert_eq!(err.kind, ErrorKind::InvalidArgument, "{format}: {err}");
        assert!(err.message.starts_with("response_format: ") && err.message.contains(says), "{format}: {err}");
    }
    let mut o = chat("Hi");
    let err = o.apply_json(r#"{"response_format": {"type": "yaml"}}"#).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert!(o.apply_json(r#"{"response_format": {"type": "text"}}"#).is_ok() && o.response_format.is_none());
    assert_eq!(e.stats().in_flight, 0, "failed submits hold no place");
}

/// Constrained and free rows in one decode batch each give the tokens they
/// give alone.
#[test]
fn constrained_and_free_rows_batch_together() {
    let e = engine();
    let schema = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}}, "required": ["name", "age"]});
    let make = |i: usize| -> RequestOptions {
        match i {
            0 => constrained("Describe a person.", json!({"type": "json_schema", "schema": schema}), 40),
            1 => {
                let mut o = chat("Write a haiku about the sea.");
                o.max_tokens = 40;
                o.stop_at_eos = false;
                o
            }
            2 => constrained("Give a phone number.", json!({"type": "regex", "pattern": "[0-9]{3}-[0-9]{4}"}), 16),
            _ => {
                let mut o = chat("Why is the sky blue?");
                o.max_tokens = 24;
                o.apply_json(r#"{"temperature": 0.8, "seed": 7}"#).unwrap();
                o
            }
        }
    };
    let alone: Vec<Vec<u32>> = (0..4).map(|i| tokens_of(&run(&e, make(i)))).collect();
    let rx: Vec<_> = (0..4).map(|i| submit(&e, make(i))).collect();
    for (i, rx) in rx.iter().enumerate() {
        assert_eq!(tokens_of(&collect(rx)), alone[i], "request {i} differs when batched");
    }
    assert!(matches!(make(0).response_format, Some(ResponseFormat::JsonSchema(_))));
    let s = wait_idle(&e);
    assert_eq!((s.active, s.kv_reserved), (0, 0), "{s:?}");
}

/// SmolLM2 as an MLX folder whose chat template describes Hermes tool calls
/// (`<tool_call>` tags), made once from the GGUF.
fn hermes_model() -> PathBuf {
    let dir = repo_root().join("target/oracle/smollm2-hermes-tools");
    if !dir.join("model.safetensors").exists() {
        py(&[repo_root().join("tests/oracle/gguf_to_mlx.py").to_str().unwrap(), model_path().to_str().unwrap(), dir.to_str().unwrap()]);
    }
    let path = dir.join("tokenizer_config.json");
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    cfg["chat_template"] = json!(
        "{% if tools %}<|im_start|>system\nCall one tool as <tool_call>{\"name\": NAME, \"arguments\": ARGS}</tool_call>. \
         Tools: {{ tools | tojson }}<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n\
         {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    );
    std::fs::write(&path, cfg.to_string()).unwrap();
    dir
}

/// `tool_choice` "required" or a named function: exactly one tool call,
/// arguments valid against that tool's schema, finish TOOL_CALLS; a model
/// without a tool-call format refuses it.
#[test]
fn required_tool_calls_have_valid_arguments() {
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 999}, "b": {"type": "integer", "minimum": 0, "maximum": 999}},
            "required": ["a", "b"], "additionalProperties": false}}}
    ]);
    let e = mlxrt::engine::Engine::new(mlxrt::engine::EngineConfig::new(hermes_model())).expect("the Hermes-template folder loads");
    for (choice, want) in [(json!("required"), None), (json!({"type": "function", "function": {"name": "add"}}), Some("add"))] {
        let mut o = chat("What is the weather in Paris?");
        o.apply_json(&json!({"tools": tools, "tool_choice": choice, "max_tokens": 64}).to_string()).unwrap();
        let ev = run(&e, o);
        let calls: Vec<(String, String)> = ev
            .iter()
            .filter_map(|e| match e {
                Event::ToolCall { name, arguments, .. } => Some((name.clone(), arguments.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(calls.len(), 1, "{choice}: {ev:?}");
        let (name, args) = &calls[0];
        if let Some(w) = want {
            assert_eq!(name, w);
        }
        let tool = tools.as_array().unwrap().iter().find(|t| t["function"]["name"] == name.as_str()).unwrap_or_else(|| panic!("{name}"));
        let args: Value = serde_json::from_str(args).unwrap();
        assert!(jsonschema::validator_for(&tool["function"]["parameters"]).unwrap().is_valid(&args), "{name}: {args}");
        assert_eq!(finish_of(&ev), FinishReason::ToolCalls, "{ev:?}");
    }
    // SmolLM2's own template has no tool-call format.
    let plain = engine();
    let mut o = chat("Hi");
    o.apply_json(&json!({"tools": tools, "tool_choice": "required"}).to_string()).unwrap();
    let err = plain.submit(o, Box::new(|_: &Event| {})).err().expect("refused");
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert!(err.message.contains("no tool-call format"), "{err}");
}
