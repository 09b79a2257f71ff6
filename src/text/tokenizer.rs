//! `Tokenizer`: a thin, thread-safe wrapper over the `tokenizers` crate that
//! adds what an engine needs: special-token parsing chosen per call, bos/eos/pad
//! ids, and the raw bytes of each token for incremental detokenization.

use super::TextError;
use serde_json::Value;
use std::path::Path;

type Result<T> = std::result::Result<T, TextError>;

/// How one token's string maps back to the bytes it stands for (mirrors the
/// decoder in tokenizer.json, one token at a time).
#[derive(Debug, Clone, PartialEq)]
enum PieceBytes {
    /// GPT-2 byte-level: every char stands for one byte.
    ByteLevel,
    /// SentencePiece style: `space` stands for ' ', `<0xAB>` for a byte (with
    /// byte fallback), and the decoder strips one leading space of the text.
    Sentencepiece {
        space: char,
        byte_fallback: bool,
        strip_leading_space: bool,
    },
    /// A decoder this module cannot invert per token (named).
    Unsupported(String),
}

/// A tokenizer usable from many threads at once.
pub struct Tokenizer {
    /// Special tokens written in the text become their ids.
    parse: tokenizers::Tokenizer,
    /// Special tokens written in the text are ordinary text. The library only
    /// has a per-tokenizer switch for this, hence a second (cloned) instance.
    plain: tokenizers::Tokenizer,
    pieces: PieceBytes,
    special: Vec<u32>,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    pad_id: Option<u32>,
    add_bos: bool,
}

/// The parts of Hugging Face's tokenizer_config.json (and chat_template.jinja)
/// that the tokenizer and chat template need.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HfTokenizerConfig {
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub pad_token: Option<String>,
    /// The default chat template (a named "default" one when the file holds a list).
    pub chat_template: Option<String>,
}

impl HfTokenizerConfig {
    /// Reads `tokenizer_config.json` and `chat_template.jinja` (newer
    /// transformers write the template there) from a model folder; files
    /// that are absent leave their fields empty.
    pub fn from_dir(dir: &Path) -> Result<HfTokenizerConfig> {
        let mut cfg = HfTokenizerConfig::default();
        let path = dir.join("tokenizer_config.json");
        if path.exists() {
            let text = read(&path)?;
            let json: Value = serde_json::from_str(&text)
                .map_err(|e| TextError::File(path.display().to_string(), e.to_string()))?;
            cfg = HfTokenizerConfig::from_json(&json);
        }
        let jinja = dir.join("chat_template.jinja");
        if jinja.exists() {
            cfg.chat_template = Some(read(&jinja)?);
        }
        Ok(cfg)
    }

    pub fn from_json(json: &Value) -> HfTokenizerConfig {
        // Token fields are either a string or an AddedToken object.
        let token = |key: &str| match &json[key] {
            Value::String(s) => Some(s.clone()),
            Value::Object(o) => o.get("content").and_then(Value::as_str).map(String::from),
            _ => None,
        };
        let chat_template = match &json["chat_template"] {
            Value::String(s) => Some(s.clone()),
            Value::Array(named) => named
                .iter()
                .find(|t| t["name"] == "default")
                .and_then(|t| t["template"].as_str())
                .map(String::from),
            _ => None,
        };
        HfTokenizerConfig {
            bos_token: token("bos_token"),
            eos_token: token("eos_token"),
            pad_token: token("pad_token"),
            chat_template,
        }
    }
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| TextError::File(path.display().to_string(), e.to_string()))
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("special", &self.special.len())
            .field("bos_id", &self.bos_id)
            .field("eos_id", &self.eos_id)
            .field("add_bos", &self.add_bos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Loads a Hugging Face tokenizer.json; bos/eos/pad come from a
    /// tokenizer_config.json next to it when there is one.
    pub fn from_file(tokenizer_json: &Path) -> Result<Tokenizer> {
        let dir = tokenizer_json.parent().unwrap_or(Path::new("."));
        Tokenizer::from_hf(tokenizer_json, &HfTokenizerConfig::from_dir(dir)?)
    }

    /// Loads a tokenizer.json with the special tokens named by `config`.
    pub fn from_hf(tokenizer_json: &Path, config: &HfTokenizerConfig) -> Result<Tokenizer> {
        let inner = tokenizers::Tokenizer::from_file(tokenizer_json)
            .map_err(|e| TextError::File(tokenizer_json.display().to_string(), e.to_string()))?;
        let id = |t: &Option<String>| t.as_deref().and_then(|t| inner.token_to_id(t));
        let (bos, eos, pad) = (
            id(&config.bos_token),
            id(&config.eos_token),
            id(&config.pad_token),
        );
        // HF adds BOS through the post-processor: probe it with an empty text.
        let leading = inner.encode_fast("", true)?.get_ids().first().copied();
        let add_bos = leading.is_some_and(|t| bos.map_or(true, |b| b == t));
        Tokenizer::new(
            inner,
            bos.or(leading.filter(|_| add_bos)),
            eos,
            pad,
            add_bos,
        )
    }

    /// Wraps a built library tokenizer (its added tokens flagged `special` are
    /// the special tokens).
    pub(super) fn new(
        parse: tokenizers::Tokenizer,
        bos_id: Option<u32>,
        eos_id: Option<u32>,
        pad_id: Option<u32>,
        add_bos: bool,
    ) -> Result<Tokenizer> {
        let mut special: Vec<u32> = parse
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        special.sort_unstable();
        let pieces = piece_bytes(parse.get_decoder())?;
        let mut plain = parse.clone();
        plain.set_encode_special_tokens(true);
        Ok(Tokenizer {
            parse,
            plain,
            pieces,
            special,
            bos_id,
            eos_id,
            pad_id,
            add_bos,
        })
    }

    /// Token ids of `text`. With `parse_special`, special tokens written in the
    /// text (e.g. `<|im_start|>` in a rendered chat prompt) become their ids;
    /// without, they are tokenized as ordinary text (use for raw user input).
    /// Never adds BOS: see `add_bos()`.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        let t = if parse_special {
            &self.parse
        } else {
            &self.plain
        };
        Ok(t.encode_fast(text, false)?.get_ids().to_vec())
    }

    /// Token ids of `text` with special tokens parsed (as `encode(text,
    /// true)`), and how many of the first ids lie wholly within
    /// `text[..split]`: where `text[..split]` ends in token terms, found
    /// without tokenizing it separately.
    pub fn encode_split(&self, text: &str, split: usize) -> Result<(Vec<u32>, usize)> {
        let enc = self.parse.encode(text, false)?;
        let within = enc.get_offsets().iter().take_while(|&&(_, end)| end <= split).count();
        Ok((enc.get_ids().to_vec(), within))
    }

    /// Text of `ids` (invalid UTF-8 becomes U+FFFD), optionally without special tokens.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        if let Some(&bad) = ids.iter().find(|&&id| self.parse.id_to_token(id).is_none()) {
            return Err(TextError::UnknownTokenId(bad));
        }
        Ok(self.parse.decode(ids, skip_special)?)
    }

    /// The bytes token `id` stands for (byte-level mapping undone; may be part
    /// of a UTF-8 sequence). None for an unknown id or a decoder that cannot be
    /// inverted per token (`check_token_bytes` says why).
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        let token = self.parse.id_to_token(id)?;
        match &self.pieces {
            PieceBytes::ByteLevel => Some(byte_level_bytes(&token)),
            PieceBytes::Sentencepiece {
                space,
                byte_fallback,
                ..
            } => {
                if *byte_fallback {
                    if let Some(b) = byte_fallback_byte(&token) {
                        return Some(vec![b]);
                    }
                }
                Some(token.replace(*space, " ").into_bytes())
            }
            PieceBytes::Unsupported(_) => None,
        }
    }

    /// Errs when `token_bytes` cannot work with this tokenizer's decoder.
    pub fn check_token_bytes(&self) -> Result<()> {
        match &self.pieces {
            PieceBytes::Unsupported(what) => Err(TextError::Unsupported(format!(
                "incremental decoding with decoder {what}"
            ))),
            _ => Ok(()),
        }
    }

    /// Whether decoding drops one leading space of the whole text
    /// (SentencePiece style); the incremental decoder does the same.
    pub(super) fn strips_leading_space(&self) -> bool {
        matches!(
            self.pieces,
            PieceBytes::Sentencepiece {
                strip_leading_space: true,
                ..
            }
        )
    }

    /// Number of ids with a token (model vocabulary and added tokens).
    pub fn vocab_size(&self) -> usize {
        self.parse.get_vocab_size(true)
    }
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.parse.token_to_id(token)
    }
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.parse.id_to_token(id)
    }
    pub fn is_special(&self, id: u32) -> bool {
        self.special.binary_search(&id).is_ok()
    }
    /// Ids of the special (control) tokens, ascending.
    pub fn special_ids(&self) -> &[u32] {
        &self.special
    }
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }
    pub fn pad_id(&self) -> Option<u32> {
        self.pad_id
    }
    /// Whether a raw (untemplated) prompt should start with `bos_id()`.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// The tokenizer as Hugging Face tokenizer.json text (bos/eos ids and
    /// `add_bos` are not part of that format).
    pub fn to_json_string(&self) -> Result<String> {
        Ok(self.parse.to_string(false)?)
    }
}

/// Finds how to invert the decoder one token at a time, from its JSON form
/// (stable across library versions, unlike the wrapper enums).
fn piece_bytes(decoder: Option<&tokenizers::DecoderWrapper>) -> Result<PieceBytes> {
    let json = serde_json::to_value(decoder).map_err(|e| TextError::Tokenizer(e.to_string()))?;
    let steps = match json["type"].as_str() {
        Some("Sequence") => json["decoders"].as_array().cloned().unwrap_or_default(),
        Some(_) => vec![json.clone()],
        None => return Ok(PieceBytes::Unsupported("none".into())),
    };
    let (mut space, mut byte_fallback, mut strip) = (None, false, false);
    for step in &steps {
        match step["type"].as_str().unwrap_or("") {
            "ByteLevel" => return Ok(PieceBytes::ByteLevel),
            "Replace" if step["content"] == " " => {
                space = step["pattern"]["String"].as_str().and_then(single_char);
            }
            "Metaspace" => {
                space = step["replacement"].as_str().and_then(single_char);
                strip = step["prepend_scheme"] != "never";
            }
            "ByteFallback" => byte_fallback = true,
            "Fuse" => {}
            "Strip" if step["content"] == " " && step["start"] == 1 && step["stop"] == 0 => {
                strip = true
            }
            other => return Ok(PieceBytes::Unsupported(other.to_string())),
        }
    }
    Ok(match space {
        Some(space) => PieceBytes::Sentencepiece {
            space,
            byte_fallback,
            strip_leading_space: strip,
        },
        None => PieceBytes::Unsupported(json["type"].as_str().unwrap_or("?").to_string()),
    })
}

fn single_char(s: &str) -> Option<char> {
    let mut chars = s.chars();
    chars.next().filter(|_| chars.next().is_none())
}

/// GPT-2's byte-to-char table inverted: printable Latin-1 bytes stand for
/// themselves, the 68 others were shifted to U+0100.. in ascending order.
fn byte_level_byte(c: char) -> Option<u8> {
    match c as u32 {
        n @ (33..=126 | 161..=172 | 174..=255) => Some(n as u8),
        n @ 256..=288 => Some((n - 256) as u8), // 0..=32
        n @ 289..=322 => Some((n - 289 + 127) as u8), // 127..=160
        323 => Some(173),
        _ => None,
    }
}

/// Like the library's ByteLevel decoder: a token with a char outside the
/// table (e.g. an added token with a space) stands for its own UTF-8 bytes.
fn byte_level_bytes(token: &str) -> Vec<u8> {
    token
        .chars()
        .map(byte_level_byte)
        .collect::<Option<Vec<u8>>>()
        .unwrap_or_else(|| token.as_bytes().to_vec())
}

/// `<0xAB>` → 0xAB, as the ByteFallback decoder reads it.
fn byte_fallback_byte(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2)
        .then(|| u8::from_str_radix(hex, 16).ok())
        .flatten()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A tiny byte-level BPE tokenizer.json: "ab" merges, two special tokens.
    pub(crate) fn tiny_byte_level() -> Tokenizer {
        let json = serde_json::json!({
            "version": "1.0",
            "added_tokens": [
                {"id": 0, "content": "<|s|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
                {"id": 1, "content": "<|e|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
            ],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                      "vocab": tiny_vocab(), "merges": [["a", "b"]]}
        });
        let inner: tokenizers::Tokenizer = json.to_string().parse().unwrap();
        Tokenizer::new(inner, Some(0), Some(1), None, false).unwrap()
    }

    /// Ids 0, 1 are the special tokens, then the 256 byte chars, then "ab".
    fn tiny_vocab() -> Value {
        let mut vocab = serde_json::Map::new();
        vocab.insert("<|s|>".into(), 0.into());
        vocab.insert("<|e|>".into(), 1.into());
        for c in (0..=323u32)
            .filter_map(char::from_u32)
            .filter(|&c| byte_level_byte(c).is_some())
        {
            let id = vocab.len();
            vocab.insert(c.to_string(), id.into());
        }
        let id = vocab.len();
        vocab.insert("ab".into(), id.into());
        Value::Object(vocab)
    }

    #[test]
    fn byte_table_is_a_bijection() {
        let mut seen = [false; 256];
        for c in (0..=400u32).filter_map(char::from_u32) {
            if let Some(b) = byte_level_byte(c) {
                assert!(!seen[b as usize], "byte {b} twice");
                seen[b as usize] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(byte_level_byte('Ġ'), Some(b' '));
        assert_eq!(byte_level_byte('Ċ'), Some(b'\n'));
    }

    #[test]
    fn encodes_special_tokens_only_when_asked() {
        let t = tiny_byte_level();
        let ab = t.token_to_id("ab").unwrap();
        let ids = t.encode("<|s|>ab", true).unwrap();
        assert_eq!(ids, vec![0, ab]);
        let plain = t.encode("<|s|>ab", false).unwrap();
        assert!(!plain.contains(&0) && plain.len() > 2, "{plain:?}");
        assert_eq!(t.decode(&plain, true).unwrap(), "<|s|>ab");
        assert_eq!(t.decode(&ids, true).unwrap(), "ab");
        assert_eq!(t.decode(&ids, false).unwrap(), "<|s|>ab");
        assert!(t.is_special(0) && t.is_special(1) && !t.is_special(ab));
        assert_eq!(t.special_ids(), &[0, 1]);
        assert_eq!(
            (t.bos_id(), t.eos_id(), t.pad_id(), t.add_bos()),
            (Some(0), Some(1), None, false)
        );
    }

    #[test]
    fn token_bytes_undo_the_byte_level_mapping() {
        let t = tiny_byte_level();
        let ids = t.encode("é €", false).unwrap();
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| t.token_bytes(id).unwrap())
            .collect();
        assert_eq!(bytes, "é €".as_bytes());
        assert_eq!(t.token_bytes(0).unwrap(), b"<|s|>");
        assert_eq!(t.token_bytes(99_999), None);
        assert_eq!(
            t.decode(&[99_999], false),
            Err(TextError::UnknownTokenId(99_999))
        );
    }

    #[test]
    fn json_round_trip_keeps_ids() {
        let t = tiny_byte_level();
        let json = t.to_json_string().unwrap();
        let back = Tokenizer::new(json.parse().unwrap(), None, None, None, false).unwrap();
        let text = "ab<|e|> x\n\n12";
        assert_eq!(
            back.encode(text, true).unwrap(),
            t.encode(text, true).unwrap()
        );
    }

    #[test]
    fn reads_hf_config_and_probes_bos() {
        let dir = std::env::temp_dir().join(format!("mlxrt-text-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut json: Value =
            serde_json::from_str(&tiny_byte_level().to_json_string().unwrap()).unwrap();
        json["post_processor"] = serde_json::json!({"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<|s|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<|s|>": {"id": "<|s|>", "ids": [0], "tokens": ["<|s|>"]}}});
        std::fs::write(dir.join("tokenizer.json"), json.to_string()).unwrap();
        std::fs::write(
            dir.join("tokenizer_config.json"),
            r#"{"eos_token": {"content": "<|e|>"}, "pad_token": "<|e|>",
                "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}"#,
        )
        .unwrap();
        let t = Tokenizer::from_file(&dir.join("tokenizer.json")).unwrap();
        assert_eq!(
            (t.bos_id(), t.eos_id(), t.pad_id(), t.add_bos()),
            (Some(0), Some(1), Some(1), true)
        );
        // encode never adds BOS itself.
        assert_eq!(t.encode("ab", false).unwrap().len(), 1);
        let cfg = HfTokenizerConfig::from_dir(&dir).unwrap();
        assert_eq!(cfg.chat_template.as_deref(), Some("D"));
        std::fs::write(dir.join("chat_template.jinja"), "J").unwrap();
        assert_eq!(
            HfTokenizerConfig::from_dir(&dir)
                .unwrap()
                .chat_template
                .as_deref(),
            Some("J")
        );
        let missing = Tokenizer::from_file(&dir.join("nope.json"))
            .unwrap_err()
            .to_string();
        assert!(missing.contains("nope.json"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sentencepiece_decoders_are_inverted() {
        let json = serde_json::json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]});
        let dec: tokenizers::DecoderWrapper = serde_json::from_value(json).unwrap();
        let p = piece_bytes(Some(&dec)).unwrap();
        assert_eq!(
            p,
            PieceBytes::Sentencepiece {
                space: '▁',
                byte_fallback: true,
                strip_leading_space: true
            }
        );
        let wp: tokenizers::DecoderWrapper = serde_json::from_value(
            serde_json::json!({"type": "WordPiece", "prefix": "##", "cleanup": true}),
        )
        .unwrap();
        assert_eq!(
            piece_bytes(Some(&wp)).unwrap(),
            PieceBytes::Unsupported("WordPiece".into())
        );
        assert_eq!(byte_fallback_byte("<0xE2>"), Some(0xE2));
        assert_eq!(byte_fallback_byte("<0xE>"), None);
    }

    #[test]
    fn is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Tokenizer>();
    }
}
