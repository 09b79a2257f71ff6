//! Structured output: a request's `response_format` compiled by llguidance
//! over the model's tokenizer into a matcher that says, before every draw,
//! which tokens keep the output valid (the row's token mask).

mod env;
mod format;

pub use format::ResponseFormat;
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
