//! Tokenizers from GGUF metadata: `tokenizer.ggml.*` keys turned into the same
//! pipeline Hugging Face's tokenizer.json would describe for that model.

use super::{TextError, Tokenizer};
use crate::mlx::io::{Meta, TensorFile};
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

type Result<T> = std::result::Result<T, TextError>;

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
const TOKEN_CONTROL: i32 = 3;
const TOKEN_USER_DEFINED: i32 = 4;

/// Llama 3's split regex (tokenizer.json `Split` pre-tokenizer).
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's: Llama 3's with single digits.
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The tokenizer part of a GGUF file's metadata.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: "gpt2" (byte-level BPE) or "llama" (SentencePiece), ...
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer recipe ("smollm", "llama-bpe", "qwen2", ...).
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    /// Merges as "left right" strings, highest priority first.
    pub merges: Vec<String>,
    pub token_types: Vec<i32>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub pad_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub add_bos: bool,
    pub add_space_prefix: bool,
    pub chat_template: Option<String>,
}

impl GgufVocab {
    pub fn from_tensor_file(file: &TensorFile) -> Result<GgufVocab> {
        let meta = |key: &str| {
            file.meta(&format!("tokenizer.{key}"))
                .map_err(|e| TextError::Gguf(format!("tokenizer.{key}: {e}")))
        };
        let wrong =
            |key: &str, want: &str| TextError::Gguf(format!("tokenizer.{key} is not {want}"));
        let string = |key: &str| match meta(key)? {
            None => Ok(None),
            Some(Meta::Str(s)) => Ok(Some(s)),
            Some(_) => Err(wrong(key, "a string")),
        };
        let list = |key: &str| match meta(key)? {
            None => Ok(None),
            Some(Meta::List(l)) => Ok(Some(l)),
            Some(_) => Err(wrong(key, "a list of strings")),
        };
        let ints = |key: &str| match meta(key)? {
            None => Ok(None),
            Some(Meta::Arr(a)) => a
                .to_vec_i32()
                .map(Some)
                .map_err(|e| TextError::Gguf(format!("tokenizer.{key}: {e}"))),
            Some(_) => Err(wrong(key, "a number")),
        };
        let scalar = |key: &str| Ok::<_, TextError>(ints(key)?.and_then(|v| v.first().copied()));
        let id = |key: &str| Ok::<_, TextError>(scalar(key)?.and_then(|v| u32::try_from(v).ok()));
        let tokens = list("ggml.tokens")?
            .ok_or_else(|| TextError::Gguf("tokenizer.ggml.tokens is missing".into()))?;
        Ok(GgufVocab {
            model: string("ggml.model")?
                .ok_or_else(|| TextError::Gguf("tokenizer.ggml.model is missing".into()))?,
            pre: string("ggml.pre")?,
            merges: list("ggml.merges")?.unwrap_or_default(),
            token_types: ints("ggml.token_type")?.unwrap_or_else(|| vec![1; tokens.len()]),
            tokens,
            bos_id: id("ggml.bos_token_id")?,
            eos_id: id("ggml.eos_token_id")?,
            pad_id: id("ggml.padding_token_id")?,
            unk_id: id("ggml.unknown_token_id")?,
            add_bos: scalar("ggml.add_bos_token")?.is_some_and(|v| v != 0),
            add_space_prefix: scalar("ggml.add_space_prefix")?.is_some_and(|v| v != 0),
            chat_template: string("chat_template")?,
        })
    }
}

/// The pre-tokenizer (and optional NFC normalization) for a `tokenizer.ggml.pre`
/// value, as in those models' tokenizer.json files.
fn pre_tokenizer(pre: &str, prefix_space: bool) -> Result<(PreTokenizerWrapper, bool)> {
    let split = |regex: &str| -> Result<PreTokenizerWrapper> {
        let split = Split::new(
            SplitPattern::Regex(regex.into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )?;
        // The split already applied the regex; ByteLevel only maps bytes.
        Ok(Sequence::new(vec![
            split.into(),
            ByteLevel::new(prefix_space, false, false).into(),
        ])
        .into())
    };
    let gpt2 = ByteLevel::new(prefix_space, true, true);
    Ok(match pre {
        "default" | "gpt-2" | "gpt2" => (gpt2.into(), false),
        "smollm" | "starcoder" | "refact" => (Sequence::new(vec![Digits::new(true).into(), gpt2.into()]).into(), false),
        "llama-bpe" | "llama3" | "llama-v3" => (split(LLAMA3_REGEX)?, false),
        "qwen2" => (split(QWEN2_REGEX)?, true),
        other => {
            return Err(TextError::Unsupported(format!(
                "GGUF pre-tokenizer {other:?} (known: default, gpt-2, smollm, starcoder, refact, llama-bpe, llama3, qwen2)"
            )))
        }
    })
}

impl Tokenizer {
    /// Builds the tokenizer a GGUF file describes. Only byte-level BPE ("gpt2")
    /// vocabularies are supported.
    pub fn from_gguf(v: &GgufVocab) -> Result<Tokenizer> {
        if v.model != "gpt2" {
            return Err(TextError::Unsupported(format!(
                "GGUF tokenizer model {:?} (only \"gpt2\" byte-level BPE is supported)",
                v.model
            )));
        }
        if v.token_types.len() != v.tokens.len() {
            return Err(TextError::Gguf(format!(
                "{} token types for {} tokens",
                v.token_types.len(),
                v.tokens.len()
            )));
        }
        let pre = v.pre.as_deref().unwrap_or("default");
        let (pre_tokenizer, nfc) = pre_tokenizer(pre, v.add_space_prefix)?;
        let vocab: Vocab = v
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let merges = v
            .merges
            .iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| TextError::Gguf("a merge without a space".into()))?;
        // Llama 3 uses a whole-word vocabulary hit before merging.
        let ignore_merges = matches!(pre, "llama-bpe" | "llama3" | "llama-v3");
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(ignore_merges)
            .build()?;

        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(pre_tokenizer));
        inner.with_decoder(Some(ByteLevel::default()));
        if nfc {
            inner.with_normalizer(Some(NFC))?;
        }
        // Control tokens are special; user-defined ones are always matched in text.
        let added: Vec<AddedToken> = v
            .tokens
            .iter()
            .zip(&v.token_types)
            .filter(|(_, &ty)| ty == TOKEN_CONTROL || ty == TOKEN_USER_DEFINED)
            .map(|(t, &ty)| AddedToken::from(t.clone(), ty == TOKEN_CONTROL).normalized(false))
            .collect();
        inner.add_tokens(added)?;
        let known = |id: Option<u32>| id.filter(|&i| (i as usize) < v.tokens.len());
        Tokenizer::new(
            inner,
            known(v.bos_id),
            known(v.eos_id),
            known(v.pad_id),
            v.add_bos,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Byte chars as tokens, a few merges, one control token.
    fn vocab(pre: &str) -> GgufVocab {
        let mut tokens = vec!["<|end|>".to_string()];
        tokens.extend(
            ['h', 'e', 'l', 'o', 'Ġ', '1', '2', '3', 'w', 'r', 'd']
                .iter()
                .map(|c| c.to_string()),
        );
        tokens.extend(["he", "ll", "hell", "hello", "Ġw", "12", "123"].map(String::from));
        let mut token_types = vec![1; tokens.len()];
        token_types[0] = TOKEN_CONTROL;
        GgufVocab {
            model: "gpt2".into(),
            pre: Some(pre.into()),
            merges: ["h e", "l l", "he ll", "hell o", "Ġ w", "1 2", "12 3"]
                .map(String::from)
                .to_vec(),
            tokens,
            token_types,
            eos_id: Some(0),
            ..Default::default()
        }
    }

    fn pieces(t: &Tokenizer, text: &str) -> Vec<String> {
        t.encode(text, true)
            .unwrap()
            .iter()
            .map(|&i| t.id_to_token(i).unwrap())
            .collect()
    }

    #[test]
    fn smollm_splits_every_digit() {
        let t = Tokenizer::from_gguf(&vocab("smollm")).unwrap();
        assert_eq!(
            pieces(&t, "hello world123<|end|>"),
            ["hello", "Ġw", "o", "r", "l", "d", "1", "2", "3", "<|end|>"]
        );
        assert_eq!(t.eos_id(), Some(0));
        assert!(t.is_special(0));
    }

    #[test]
    fn gpt2_and_llama3_group_digits() {
        let gpt2 = Tokenizer::from_gguf(&vocab("gpt-2")).unwrap();
        assert_eq!(pieces(&gpt2, "123"), ["123"]);
        let llama3 = Tokenizer::from_gguf(&vocab("llama-bpe")).unwrap();
        assert_eq!(pieces(&llama3, "hello 123"), ["hello", "Ġ", "123"]);
        let qwen2 = Tokenizer::from_gguf(&vocab("qwen2")).unwrap();
        assert_eq!(pieces(&qwen2, "123"), ["1", "2", "3"]);
    }

    #[test]
    fn rejects_unknown_kinds_by_name() {
        let err = Tokenizer::from_gguf(&vocab("mystery"))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("\"mystery\""), "{err}");
        let spm = GgufVocab {
            model: "llama".into(),
            ..vocab("default")
        };
        let err = Tokenizer::from_gguf(&spm).err().unwrap().to_string();
        assert!(err.contains("\"llama\""), "{err}");
        let bad = GgufVocab {
            merges: vec!["nospace".into()],
            ..vocab("default")
        };
        assert!(Tokenizer::from_gguf(&bad).is_err());
    }
}
