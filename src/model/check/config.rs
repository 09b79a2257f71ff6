//! Sizes in a model's config (config.json, or the GGUF metadata turned into
//! one): each an integer in a sane range and the head counts consistent, so
//! a negative, zero or absurd value (`hidden_size: 2^40`, 0 layers, vocab 0)
//! fails the load with its name before any layer or cache is sized by it.

use crate::error::{Error, Result};
use serde_json::Value;

/// (key, smallest, largest): checked wherever present (and not null), at
/// the top level and under `text_config`. The bounds are far beyond any real
/// model's and far below what would overflow the `i32` shapes built from them.
const SIZES: &[(&str, i64, i64)] = &[
    ("hidden_size", 1, 1 << 17),
    ("intermediate_size", 1, 1 << 20),
    ("moe_intermediate_size", 1, 1 << 20),
    ("shared_expert_intermediate_size", 0, 1 << 20),
    ("num_hidden_layers", 1, 1 << 10),
    ("num_attention_heads", 1, 1 << 10),
    ("num_key_value_heads", 1, 1 << 10),
    ("num_global_key_value_heads", 1, 1 << 10),
    ("head_dim", 1, 1 << 13),
    ("global_head_dim", 1, 1 << 13),
    ("vocab_size", 1, 1 << 24),
    ("vocab_size_per_layer_input", 0, 1 << 24),
    ("hidden_size_per_layer_input", 0, 1 << 17),
    ("max_position_embeddings", 1, 1 << 32),
    ("num_experts", 0, 1 << 14),
    ("num_local_experts", 0, 1 << 14),
    ("num_experts_per_tok", 0, 1 << 14),
    ("num_kv_shared_layers", 0, 1 << 10),
    ("linear_num_key_heads", 1, 1 << 10),
    ("linear_num_value_heads", 1, 1 << 10),
    ("linear_key_head_dim", 1, 1 << 13),
    ("linear_value_head_dim", 1, 1 << 13),
    ("linear_conv_kernel_dim", 1, 1 << 10),
];

/// Checks `config` and its `text_config` (see `SIZES`).
pub fn check(config: &Value) -> Result<()> {
    check_object(config, "")?;
    if let Some(t) = config.get("text_config").filter(|t| t.is_object()) {
        check_object(t, "text_config.")?;
    }
    Ok(())
}

fn check_object(c: &Value, path: &str) -> Result<()> {
    let bad = |key: &str, v: &Value, why: String| Error::model(format!("config.json: `{path}{key}` is {v}: {why}"));
    let get = |key: &str| -> Result<Option<i64>> {
        let Some((_, lo, hi)) = SIZES.iter().find(|(k, ..)| *k == key) else { return Ok(None) };
        match c.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_i64() {
                Some(n) if (*lo..=*hi).contains(&n) => Ok(Some(n)),
                Some(_) => Err(bad(key, v, format!("expected {lo} to {hi}"))),
                None => Err(bad(key, v, "expected an integer".into())),
            },
        }
    };
    let mut found = Vec::new();
    for (key, ..) in SIZES {
        found.push((*key, get(key)?));
    }
    let value = |key: &str| found.iter().find(|(k, _)| *k == key).and_then(|(_, v)| *v);
    let heads = value("num_attention_heads");
    if let (Some(h), Some(kv)) = (heads, value("num_key_value_heads")) {
        if h % kv != 0 {
            return Err(Error::model(format!(
                "config.json: `{path}num_attention_heads` ({h}) is not a multiple of `{path}num_key_value_heads` ({kv})"
            )));
        }
    }
    if let (Some(d), Some(h), None) = (value("hidden_size"), heads, value("head_dim")) {
        if d % h != 0 {
            return Err(Error::model(format!(
                "config.json: `{path}hidden_size` ({d}) is not a multiple of `{path}num_attention_heads` ({h}) and there is no `head_dim`"
            )));
        }
    }
    let experts = value("num_experts").or(value("num_local_experts")).unwrap_or(0);
    if let Some(k) = value("num_experts_per_tok") {
        if experts > 0 && k > experts {
            return Err(Error::model(format!(
                "config.json: `{path}num_experts_per_tok` ({k}) is more than the {experts} experts"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check;
    use serde_json::json;

    fn err(c: serde_json::Value) -> String {
        let e = check(&c).expect_err("an absurd config passed");
        assert_eq!(e.kind, crate::ErrorKind::ModelLoad);
        e.message
    }

    #[test]
    fn accepts_real_sizes() {
        let llama = json!({"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "vocab_size": 128256, "intermediate_size": 14336,
            "max_position_embeddings": 131072, "sliding_window": null});
        check(&llama).unwrap();
        check(&json!({"text_config": {"hidden_size": 2560, "head_dim": 256, "num_attention_heads": 8}})).unwrap();
    }

    #[test]
    fn names_absurd_sizes() {
        assert!(err(json!({"hidden_size": 1u64 << 40})).contains("`hidden_size` is 1099511627776: expected 1 to 131072"));
        assert!(err(json!({"num_hidden_layers": 0})).contains("`num_hidden_layers` is 0"));
        assert!(err(json!({"vocab_size": 0})).contains("`vocab_size` is 0"));
        assert!(err(json!({"intermediate_size": -5})).contains("`intermediate_size` is -5"));
        assert!(err(json!({"head_dim": "64"})).contains("`head_dim` is \"64\": expected an integer"));
        assert!(err(json!({"text_config": {"vocab_size": 1.5}})).contains("`text_config.vocab_size` is 1.5"));
        assert!(err(json!({"num_attention_heads": 12, "num_key_value_heads": 5})).contains("not a multiple of `num_key_value_heads`"));
        assert!(err(json!({"hidden_size": 100, "num_attention_heads": 3})).contains("no `head_dim`"));
        assert!(err(json!({"num_experts": 4, "num_experts_per_tok": 8})).contains("more than the 4 experts"));
    }
}
