//! The tokenizer as llguidance sees it: every id's bytes in a token trie,
//! built once per engine.

use crate::error::{Error, Result};
use crate::text::Tokenizer;
use llguidance::ParserFactory;
use std::sync::Arc;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// llguidance's parser factory over one model's tokenizer.
pub(crate) struct GrammarEnv {
    pub(super) factory: ParserFactory,
}

impl GrammarEnv {
    /// `width` is the model's logits width (it may exceed the tokenizer's
    /// vocabulary: padded embedding rows get no bytes and are never allowed);
    /// `eos` every id that ends a sequence (allowed only where the grammar
    /// may end).
    pub fn new(tok: Arc<Tokenizer>, width: usize, eos: &[u32]) -> Result<GrammarEnv> {
        let unusable = |m: String| Error::unsupported(format!("structured output with this tokenizer: {m}"));
        tok.check_token_bytes().map_err(|e| unusable(e.to_string()))?;
        let width = width.max(tok.vocab_size());
        let words: Vec<Vec<u8>> = (0..width as u32)
            .map(|id| {
                if tok.is_special(id) {
                    // toktrie's marker for special tokens: grammars never
                    // produce them as text.
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend(tok.id_to_token(id).unwrap_or_default().into_bytes());
                    w
                } else {
                    tok.token_bytes(id).unwrap_or_default()
                }
            })
            .collect();
        let first_eos = *eos.first().ok_or_else(|| unusable("the model has no end-of-sequence token".into()))?;
        let mut info = TokRxInfo::new(width as u32, first_eos);
        info.tok_bos = tok.bos_id();
        info.tok_pad = tok.pad_id();
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
        let env: TokEnv = Arc::new(Env { trie, tok });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| unusable(e.to_string()))?;
        // Warnings and errors come back as results, never on the host's stderr.
        factory.quiet();
        Ok(GrammarEnv { factory })
    }
}

struct Env {
    trie: TokTrie,
    tok: Arc<Tokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// The model's own tokenization of text (special-token text is plain
    /// text here); bytes that are not UTF-8 fall back to the trie's greedy
    /// split.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s).ok().and_then(|s| self.tok.encode(s, false).ok()) {
            Some(ids) => ids,
            None => self.trie.greedy_tokenize(s),
        }
    }
}
