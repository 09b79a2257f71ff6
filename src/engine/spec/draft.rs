//! Draft-model drafting: a second, smaller model with the target's tokenizer
//! proposes the next γ tokens greedily (its argmax, one token at a time),
//! and the target checks them in its verify step like prompt-lookup drafts.
//!
//! The drafter keeps, per speculating row (keyed by request id), a
//! single-row KV cache of the draft model and the tokens that cache has
//! consumed. Each proposal first cuts that cache back to the longest common
//! prefix with the row's history (rejected drafts, or nothing after a
//! full acceptance), feeds the rest of the history (the whole prompt on the
//! first call, in chunks), then drafts. The last draft is never fed: the
//! next round feeds it if the target kept it.
//!
//! Greedy drafts are a deterministic function of the context, so the
//! verify step's rejection rule for sampled rows (`accept::sampled`, which
//! treats the draft as one-hot) stays exact.

use crate::cache::LayerCache;
use crate::error::{Error, Result};
use crate::mlx::{self, Array, Dtype};
use crate::model::load::LoadedModel;
use crate::model::{LanguageModel, ModelInfo, Output};
use std::cell::RefCell;
use std::collections::HashMap;

/// Positions per draft-model forward when catching up on a row's history.
const CHUNK: usize = 512;

/// One row's draft cache and the tokens it holds, in order.
struct DraftRow {
    cache: Vec<LayerCache>,
    consumed: Vec<i32>,
}

/// The draft model and its rows (scheduler thread only; interior
/// mutability so a decode step can borrow it beside the target).
pub(crate) struct Drafter {
    model: Box<dyn LanguageModel>,
    rows: RefCell<HashMap<u64, DraftRow>>,
}

impl Drafter {
    /// Takes a loaded draft model after checking it fits the target: the
    /// same vocabulary (sizes, every token's bytes, special and end ids) and
    /// caches that can be cut back (no recurrent state, no sliding ring).
    pub fn new(draft: LoadedModel, target_info: &ModelInfo, target: &crate::model::load::TextAssets) -> Result<Drafter> {
        let bad = |why: String| Error::invalid(format!("draft_model_path: {why}"));
        let (dt, tt) = (&draft.text.tokenizer, &target.tokenizer);
        let (dv, tv) = (draft.model.info().vocab_size, target_info.vocab_size);
        if dv != tv {
            return Err(bad(format!("the draft model's vocabulary has {dv} entries, the target's {tv}: they must share one tokenizer")));
        }
        if dt.vocab_size() != tt.vocab_size() {
            return Err(bad(format!(
                "the draft tokenizer has {} tokens, the target's {}: they must share one tokenizer",
                dt.vocab_size(),
                tt.vocab_size()
            )));
        }
        if let Some(id) = (0..tt.vocab_size() as u32).find(|&id| dt.token_bytes(id) != tt.token_bytes(id)) {
            return Err(bad(format!("token {id} differs between the draft and target tokenizers")));
        }
        if dt.special_ids() != tt.special_ids() || draft.text.eos_ids != target.eos_ids || dt.bos_id() != tt.bos_id() {
            return Err(bad("the draft and target tokenizers have different special or end-of-sequence tokens".into()));
        }
        if !draft.model.new_cache(1).iter().all(LayerCache::trimmable) {
            return Err(bad(format!(
                "the draft model ({}) has recurrent-state or sliding-window layers, whose caches cannot be cut back \
                 after a rejected draft",
                draft.model.info().architecture
            )));
        }
        Ok(Drafter { model: draft.model, rows: RefCell::new(HashMap::new()) })
    }

    /// Up to `gamma` greedy drafts to follow `history` (prompt, generated
    /// ids and the pending token) for request `id`.
    pub fn propose(&self, id: u64, history: &[i32], gamma: usize) -> Result<Vec<i32>> {
        if gamma == 0 || history.is_empty() {
            return Ok(vec![]);
        }
        let mut rows = self.rows.borrow_mut();
        let row = rows.entry(id).or_insert_with(|| DraftRow { cache: self.model.new_cache(1), consumed: vec![] });
        match self.draft(row, history, gamma) {
            Ok(d) => Ok(d),
            Err(e) => {
                rows.remove(&id); // its cache may hold a half-fed chunk
                Err(e)
            }
        }
    }

    fn draft(&self, row: &mut DraftRow, history: &[i32], gamma: usize) -> Result<Vec<i32>> {
        let common = row.consumed.iter().zip(history).take_while(|(a, b)| a == b).count();
        // Always feed at least the last history token: its logits give the
        // first draft.
        let keep = common.min(history.len() - 1);
        let cut = (row.consumed.len() - keep) as i32;
        if cut > 0 {
            for c in row.cache.iter_mut() {
                c.trim(cut)?;
            }
            row.consumed.truncate(keep);
        }
        let rest = &history[keep..];
        let (head, last) = rest.split_at(rest.len() - 1);
        for chunk in head.chunks(CHUNK) {
            let x = Array::from_i32(chunk, &[1, chunk.len() as i32])?;
            self.model.forward(&x, &mut row.cache, Output::CacheOnly)?;
            if head.len() > CHUNK {
                // A long catch-up: bound the graph, one chunk at a time.
                mlx::eval(&row.cache.iter().flat_map(LayerCache::state).collect::<Vec<_>>())?;
            }
            row.consumed.extend_from_slice(chunk);
        }
        // The drafts, as one lazy chain: each argmax feeds the next step.
        let mut x = Array::from_i32(last, &[1, 1])?;
        row.consumed.push(last[0]);
        let mut drafts = Vec::with_capacity(gamma);
        for i in 0..gamma {
            let logits = self.model.forward(&x, &mut row.cache, Output::LastLogits)?.expect("logits requested");
            let t = logits.reshape(&[1, -1])?.argmax(-1, false)?.astype(Dtype::I32)?;
            if i + 1 < gamma {
                x = t.reshape(&[1, 1])?;
            }
            drafts.push(t);
        }
        let all = Array::concatenate(&drafts.iter().collect::<Vec<_>>(), 0)?;
        let drafts = all.to_vec_i32()?;
        row.consumed.extend_from_slice(&drafts[..gamma - 1]);
        Ok(drafts)
    }

    /// Drops the rows whose request is not in `live` (ended, cancelled,
    /// failed).
    pub fn retain(&self, live: impl Fn(u64) -> bool) {
        self.rows.borrow_mut().retain(|&id, _| live(id));
    }

    /// Rows holding a draft cache now.
    pub fn rows(&self) -> usize {
        self.rows.borrow().len()
    }
}
