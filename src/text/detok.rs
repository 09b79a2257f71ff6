//! Incremental detokenization: token ids in, complete UTF-8 text out. A
//! character split across tokens (byte tokens of an emoji, say) is held back
//! until its last byte arrives; each step costs O(token length).

use super::{TextError, Tokenizer};
use std::sync::Arc;

/// Decodes one token at a time; the concatenated output equals
/// `Tokenizer::decode` of all ids (with the same `skip_special`).
pub struct IncrementalDecoder {
    tokenizer: Arc<Tokenizer>,
    skip_special: bool,
    /// Bytes of an unfinished UTF-8 sequence (at most 3).
    pending: Vec<u8>,
    /// No byte produced yet (for decoders that strip one leading space).
    at_start: bool,
}

impl IncrementalDecoder {
    /// Special tokens produce no text; see `with_special_text`. Errs when the
    /// tokenizer's decoder cannot be inverted token by token.
    pub fn new(tokenizer: Arc<Tokenizer>) -> Result<IncrementalDecoder, TextError> {
        tokenizer.check_token_bytes()?;
        Ok(IncrementalDecoder {
            tokenizer,
            skip_special: true,
            pending: Vec::new(),
            at_start: true,
        })
    }

    /// Whether special tokens (e.g. `<|im_end|>`) produce their text.
    pub fn with_special_text(mut self, emit: bool) -> IncrementalDecoder {
        self.skip_special = !emit;
        self
    }

    /// Adds one token; returns the text it completes (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String, TextError> {
        let bytes = self
            .tokenizer
            .token_bytes(id)
            .ok_or(TextError::UnknownTokenId(id))?;
        if self.skip_special && self.tokenizer.is_special(id) {
            return Ok(String::new());
        }
        let mut bytes = bytes.as_slice();
        if self.at_start && !bytes.is_empty() {
            self.at_start = false;
            if self.tokenizer.strips_leading_space() {
                bytes = bytes.strip_prefix(b" ").unwrap_or(bytes);
            }
        }
        self.pending.extend_from_slice(bytes);
        Ok(self.take_complete())
    }

    /// Ends the stream: an unfinished sequence left over becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }

    /// Moves the complete characters out of `pending`, replacing invalid
    /// bytes the way `String::from_utf8_lossy` does (as `decode` does).
    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut rest = self.pending.as_slice();
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[bad..];
                        }
                        // An unfinished sequence at the end: wait for more bytes.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::tokenizer::tests::tiny_byte_level;

    fn stream(dec: &mut IncrementalDecoder, ids: &[u32]) -> Vec<String> {
        let mut out: Vec<String> = ids.iter().map(|&id| dec.push(id).unwrap()).collect();
        out.push(dec.finish());
        out
    }

    #[test]
    fn multibyte_chars_wait_for_their_last_byte() {
        let t = Arc::new(tiny_byte_level());
        let text = "a🙂b é€ 日本";
        let ids = t.encode(text, false).unwrap();
        // The tiny vocab only has byte tokens: the emoji is 4 tokens.
        assert!(ids.len() > text.chars().count());
        let pieces = stream(&mut IncrementalDecoder::new(t.clone()).unwrap(), &ids);
        assert_eq!(pieces.concat(), text);
        assert_eq!(pieces.concat(), t.decode(&ids, true).unwrap());
        assert!(pieces.contains(&"🙂".to_string()), "{pieces:?}");
        assert_eq!(
            pieces.iter().filter(|p| p.is_empty()).count(),
            ids.len() + 1 - text.chars().count()
        );
    }

    #[test]
    fn special_tokens_are_skipped_by_default() {
        let t = Arc::new(tiny_byte_level());
        let ids = t.encode("<|s|>ab<|e|>", true).unwrap();
        assert_eq!(
            stream(&mut IncrementalDecoder::new(t.clone()).unwrap(), &ids).concat(),
            "ab"
        );
        let mut with = IncrementalDecoder::new(t.clone())
            .unwrap()
            .with_special_text(true);
        assert_eq!(
            stream(&mut with, &ids).concat(),
            t.decode(&ids, false).unwrap()
        );
        assert_eq!(with.push(12345), Err(TextError::UnknownTokenId(12345)));
    }

    #[test]
    fn invalid_bytes_match_lossy_decode() {
        let t = Arc::new(tiny_byte_level());
        let byte_token = |b: u8| {
            // The token whose byte-level char stands for `b`.
            (0..t.vocab_size() as u32)
                .find(|&i| t.token_bytes(i) == Some(vec![b]))
                .unwrap()
        };
        // A lone continuation byte, a truncated 3-byte sequence, then ASCII,
        // and an unfinished sequence at the very end.
        let ids: Vec<u32> = [0x80, 0xE2, 0x82, b'x', 0xF0, 0x9F]
            .iter()
            .map(|&b| byte_token(b))
            .collect();
        let pieces = stream(&mut IncrementalDecoder::new(t.clone()).unwrap(), &ids);
        assert_eq!(pieces.concat(), t.decode(&ids, true).unwrap());
        assert_eq!(pieces.concat(), "\u{FFFD}\u{FFFD}x\u{FFFD}");
        assert_eq!(pieces[0], "\u{FFFD}");
        assert_eq!(pieces.last().unwrap(), "\u{FFFD}");
    }

    /// A SentencePiece-style BPE: "▁" for spaces, byte fallback, and a decoder
    /// that strips the leading space.
    fn tiny_sentencepiece() -> Tokenizer {
        let mut vocab = vec!["<unk>".to_string(), "<s>".into()];
        vocab.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
        vocab.extend(["▁", "H", "i", "▁H", "▁Hi"].map(String::from));
        let vocab: serde_json::Map<_, _> = vocab
            .into_iter()
            .enumerate()
            .map(|(i, t)| (t, i.into()))
            .collect();
        let json = serde_json::json!({
            "version": "1.0",
            "added_tokens": [{"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
            "normalizer": null,
            "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false},
            "post_processor": null,
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
            "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                      "vocab": vocab, "merges": [["▁", "H"], ["▁H", "i"]]}
        });
        Tokenizer::new(json.to_string().parse().unwrap(), Some(1), None, None, true).unwrap()
    }

    #[test]
    fn sentencepiece_byte_fallback_and_leading_space() {
        let t = Arc::new(tiny_sentencepiece());
        let text = "Hi Hi🙂 é";
        let ids = t.encode(text, false).unwrap();
        assert_eq!(t.id_to_token(ids[0]).as_deref(), Some("▁Hi"));
        let mut all = vec![1];
        all.extend(&ids);
        let pieces = stream(&mut IncrementalDecoder::new(t.clone()).unwrap(), &all);
        assert_eq!(pieces.concat(), text);
        assert_eq!(pieces.concat(), t.decode(&all, true).unwrap());
    }
}
