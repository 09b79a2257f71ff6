//! Structured output: a request's `response_format` compiled by llguidance
//! over the model's tokenizer into a matcher that says, before every draw,
//! which tokens keep the output valid (the row's token mask).

mod env;
mod format;
mod tools;

pub use format::ResponseFormat;
pub use tools::ToolChoice;
pub(crate) use tools::call_format;
pub(crate) use env::GrammarEnv;

use crate::error::{Error, Result};
use crate::mlx::{Array, Dtype};
use llguidance::Matcher;
use toktrie::SimpleVob;

/// One request's constraint: its matcher and the mask for its next draw.
pub(crate) struct Constraint {
    matcher: Matcher,
    /// Allowed ids for the next draw, computed ahead (None = not yet).
    mask: Option<SimpleVob>,
}

impl Constraint {
    /// Compiles `format`; an invalid schema, regex or grammar is an
    /// `INVALID_ARGUMENT` with llguidance's message.
    pub fn compile(env: &GrammarEnv, format: &ResponseFormat) -> Result<Constraint> {
        let parser = env
            .factory
            .create_parser(format.grammar())
            .map_err(|e| Error::invalid(format!("response_format: {e}")))?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(Error::invalid(format!("response_format: {e}")));
        }
        let mask = matcher.compute_mask().map_err(|e| Error::invalid(format!("response_format: {e}")))?;
        if mask.is_zero() {
            return Err(Error::invalid("response_format: the constraint allows no output at all"));
        }
        Ok(Constraint { matcher, mask: Some(mask) })
    }

    /// Advances past a drawn token. Errs if the token was not allowed (a
    /// draw outside the mask would be an engine bug).
    pub fn consume(&mut self, tok: u32) -> Result<()> {
        self.mask = None;
        self.matcher
            .consume_token(tok)
            .map_err(|e| Error::internal(format!("structured output: token {tok} rejected: {e}")))
    }

    /// Whether the output is complete and nothing more may follow (the
    /// grammar was finished, or an end token consumed).
    pub fn is_done(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// The allowed ids for the next draw (computed now unless `prepare`
    /// already did); once done, only the end tokens.
    pub fn mask(&mut self) -> Result<&SimpleVob> {
        if self.mask.is_none() {
            let m = self
                .matcher
                .compute_mask_or_eos()
                .map_err(|e| Error::internal(format!("structured output: computing the token mask: {e}")))?;
            self.mask = Some(m);
        }
        Ok(self.mask.as_ref().expect("just set"))
    }

    /// Writes the mask as one byte per id (1 = allowed) into `out`, whose
    /// length is the logits width.
    pub fn write_mask(&mut self, out: &mut [u8]) -> Result<()> {
        let mask = self.mask()?;
        out.fill(0);
        let n = out.len();
        mask.iter_set_entries(|i| {
            if i < n {
                out[i] = 1;
            }
        });
        Ok(())
    }
}

/// `logits` (`[B, V]`) with every token a row's constraint forbids set to
/// -inf, or None when no row is constrained. Rows given None keep their
/// logits bit for bit (same dtype), so free and constrained rows batch
/// together. A row whose mask cannot be computed is returned with its error
/// (its logits stay unmasked; the caller ends it).
pub(crate) fn mask_logits(rows: Vec<Option<&mut Constraint>>, logits: &Array) -> Result<(Option<Array>, Vec<(usize, Error)>)> {
    if rows.iter().all(Option::is_none) {
        return Ok((None, vec![]));
    }
    let (b, v) = (rows.len(), logits.dim(-1) as usize);
    let mut allowed = vec![1u8; b * v];
    let mut failed = vec![];
    for (i, c) in rows.into_iter().enumerate() {
        if let Some(c) = c {
            if let Err(e) = c.write_mask(&mut allowed[i * v..(i + 1) * v]) {
                allowed[i * v..(i + 1) * v].fill(1);
                failed.push((i, e));
            }
        }
    }
    let allowed = Array::from_bytes(&allowed, &[b as i32, v as i32], Dtype::Bool)?;
    let forbidden = Array::scalar_f32(f32::NEG_INFINITY)?.astype(logits.dtype())?;
    Ok((Some(Array::select(&allowed, logits, &forbidden)?), failed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::tiny_byte_level;
    use serde_json::json;
    use std::sync::Arc;

    /// The tiny tokenizer (ids 0, 1 special, 1 = EOS) with 4 padded ids.
    fn env() -> (GrammarEnv, Arc<crate::text::Tokenizer>) {
        let tok = Arc::new(tiny_byte_level());
        let width = tok.vocab_size() + 4;
        (GrammarEnv::new(tok.clone(), width, &[1]).unwrap(), tok)
    }

    fn id(tok: &crate::text::Tokenizer, s: &str) -> u32 {
        let ids = tok.encode(s, false).unwrap();
        assert_eq!(ids.len(), 1, "{s:?} is one token");
        ids[0]
    }

    #[test]
    fn masks_follow_the_grammar_and_end_tokens_only_at_the_end() {
        let (env, tok) = env();
        let mut c = Constraint::compile(&env, &ResponseFormat::Regex("[0-9]{2}".into())).unwrap();
        let allowed = |c: &mut Constraint| c.mask().unwrap().to_list();
        let digits: Vec<u32> = (0..10).map(|d| id(&tok, &d.to_string())).collect();
        let mut want = digits.clone();
        want.sort();
        assert_eq!(allowed(&mut c), want, "only digits first; no special, padded or end token");
        c.consume(digits[4]).unwrap();
        assert!(!c.is_done());
        c.consume(digits[2]).unwrap();
        assert!(c.is_done(), "two digits complete the regex");
        assert_eq!(allowed(&mut c), vec![1], "then only the end token");
        assert!(Constraint::compile(&env, &ResponseFormat::Regex("[0-9]".into())).unwrap().consume(id(&tok, "x")).is_err());
    }

    #[test]
    fn compile_errors_are_invalid_arguments() {
        let (env, _) = env();
        for f in [
            ResponseFormat::JsonSchema(json!({"type": "frobnicate"})),
            ResponseFormat::Regex("(".into()),
            ResponseFormat::Lark("start: nowhere".into()),
        ] {
            let e = Constraint::compile(&env, &f).err().unwrap();
            assert_eq!(e.kind, crate::ErrorKind::InvalidArgument, "{f:?}");
            assert!(e.message.starts_with("response_format: "), "{e}");
        }
    }

    #[test]
    fn only_constrained_rows_are_masked() {
        let (env, tok) = env();
        let width = tok.vocab_size() + 4;
        let mut c = Constraint::compile(&env, &ResponseFormat::Regex("b".into())).unwrap();
        let values: Vec<f32> = (0..2 * width).map(|i| (i % 7) as f32 - 3.0).collect();
        let logits = Array::from_f32(&values, &[2, width as i32]).unwrap();
        let (masked, failed) = mask_logits(vec![None, Some(&mut c)], &logits).unwrap();
        assert!(failed.is_empty());
        let out = masked.unwrap().to_vec_f32().unwrap();
        assert_eq!(&out[..width], &values[..width], "a free row is untouched");
        let b = id(&tok, "b") as usize;
        for (i, &v) in out[width..].iter().enumerate() {
            assert_eq!(v, if i == b { values[width + i] } else { f32::NEG_INFINITY }, "id {i}");
        }
        assert!(mask_logits(vec![None, None], &logits).unwrap().0.is_none(), "no constraint, no work");
    }
}
