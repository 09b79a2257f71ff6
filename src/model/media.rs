//! The media side of a model (scheduler thread): the towers that turn
//! processed images or audio (`media::MediaItem`) into rows of the language
//! model's input, and those rows placed in a prompt (`MediaInput`) for
//! `LanguageModel::forward_media`.

use crate::error::{Error, Result};
use crate::media::{MediaItem, MediaKind};
use crate::mlx::Array;

/// A vision or audio encoder with its projector into the language model.
pub trait Tower {
    /// Encodes `items` (all of this tower's kind, as its processor made
    /// them) in one batch where it can: one `Encoded` per item.
    fn encode(&self, items: &[&MediaItem]) -> Result<Vec<Encoded>>;
    /// Every parameter array (evaluated at load, counted in memory).
    fn parameters(&self) -> Vec<&Array>;
}

/// One item's tower output: `[tokens, hidden]` rows for its soft tokens,
/// and as many for each deepstack layer (Qwen3-VL; none elsewhere).
pub struct Encoded {
    pub rows: Array,
    pub deepstack: Vec<Array>,
}

impl Encoded {
    pub fn share(&self) -> Encoded {
        Encoded { rows: self.rows.share(), deepstack: self.deepstack.iter().map(Array::share).collect() }
    }

    pub fn nbytes(&self) -> usize {
        self.arrays().iter().map(|a| a.nbytes()).sum()
    }

    /// The arrays to evaluate.
    pub fn arrays(&self) -> Vec<&Array> {
        std::iter::once(&self.rows).chain(&self.deepstack).collect()
    }
}

/// The towers a checkpoint has, by the kind of media they take.
#[derive(Default)]
pub struct Towers {
    pub image: Option<Box<dyn Tower>>,
    pub audio: Option<Box<dyn Tower>>,
}

impl Towers {
    pub fn get(&self, kind: MediaKind) -> Option<&dyn Tower> {
        match kind {
            MediaKind::Image => self.image.as_deref(),
            MediaKind::Audio => self.audio.as_deref(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.image.is_none() && self.audio.is_none()
    }

    pub fn parameters(&self) -> Vec<&Array> {
        self.image.iter().chain(&self.audio).flat_map(|t| t.parameters()).collect()
    }
}

/// Embeddings that replace some positions' token embeddings in a one-row
/// forward (`LanguageModel::forward_media`).
pub struct MediaInput {
    /// `[n, hidden]`: the rows, in the language model's space, in prompt order.
    pub features: Array,
    /// The chunk positions of `features`' rows (ascending).
    pub at: Vec<usize>,
    /// Chunk positions whose embedding is zero (Gemma 3: the pad token).
    pub zero: Vec<usize>,
    /// Per deepstack layer (Qwen3-VL): `[n, hidden]` rows added at the
    /// positions of `at` after that layer.
    pub deepstack: Vec<Array>,
    /// Multimodal RoPE (Qwen3-VL): each chunk position's (t, h, w) position,
    /// and the offset decoding continues with (see `Timeline`).
    pub mrope: Option<(Vec<[i32; 3]>, i32)>,
    /// Chunk spans whose tokens attend to one another both ways (Gemma 4's
    /// images), in order.
    pub blocks: Vec<std::ops::Range<usize>>,
}

impl MediaInput {
    /// The part for positions `from..to`, renumbered from `from`.
    pub fn window(&self, from: usize, to: usize) -> Result<MediaInput> {
        let keep: Vec<usize> = (0..self.at.len()).filter(|&k| (from..to).contains(&self.at[k])).collect();
        let rows = |a: &Array| -> Result<Array> {
            if keep.len() == self.at.len() {
                return Ok(a.share());
            }
            let idx: Vec<i32> = keep.iter().map(|&k| k as i32).collect();
            Ok(a.take(&Array::from_i32(&idx, &[idx.len() as i32])?, 0)?)
        };
        Ok(MediaInput {
            features: rows(&self.features)?,
            at: keep.iter().map(|&k| self.at[k] - from).collect(),
            zero: self.zero.iter().filter(|p| (from..to).contains(*p)).map(|p| p - from).collect(),
            deepstack: self.deepstack.iter().map(rows).collect::<Result<_>>()?,
            mrope: self.mrope.as_ref().map(|(p, d)| (p[from.min(p.len())..to.min(p.len())].to_vec(), *d)),
            blocks: self.blocks.iter().filter(|b| b.start >= from && b.end <= to).map(|b| b.start - from..b.end - from).collect(),
        })
    }

    /// `h` (`[1, L, hidden]`) with the positions of `at` replaced by the
    /// features and those of `zero` zeroed.
    pub fn splice(&self, h: &Array) -> Result<Array> {
        let l = h.dim(1);
        if self.at.iter().chain(&self.zero).any(|&p| p >= l as usize) {
            return Err(Error::internal("media rows do not fit the chunk"));
        }
        let mut zero = vec![false; l as usize];
        self.zero.iter().for_each(|&p| zero[p] = true);
        let h = Array::select(&flags(&zero)?, &h.scalar_like(0.0)?, h)?;
        match self.placed(&self.features, h.dim(1))? {
            Some((at, rows)) => Ok(Array::select(&at, &rows.astype(h.dtype())?, &h)?),
            None => Ok(h),
        }
    }

    /// `h` plus deepstack layer `i`'s rows at the positions of `at`.
    pub fn add_deepstack(&self, i: usize, h: &Array) -> Result<Array> {
        match self.placed(&self.deepstack[i], h.dim(1))? {
            Some((at, rows)) => Ok(h.add(&Array::select(&at, &rows.astype(h.dtype())?, &h.scalar_like(0.0)?)?)?),
            None => Ok(h.share()),
        }
    }

    /// `rows` (`[n, hidden]`, one per position of `at`) laid out over `l`
    /// positions (`[1, l, hidden]`) and where they are (`[1, l, 1]`); None
    /// when there are none.
    fn placed(&self, rows: &Array, l: i32) -> Result<Option<(Array, Array)>> {
        if rows.dim(0) as usize != self.at.len() {
            return Err(Error::internal("media rows do not fit the chunk"));
        }
        if self.at.is_empty() {
            return Ok(None);
        }
        let (mut idx, mut at) = (vec![0i32; l as usize], vec![false; l as usize]);
        for (i, &p) in self.at.iter().enumerate() {
            idx[p] = i as i32;
            at[p] = true;
        }
        let d = rows.dim(1);
        let laid = rows.take(&Array::from_i32(&idx, &[l])?, 0)?.reshape(&[1, l, d])?;
        Ok(Some((flags(&at)?, laid)))
    }
}

/// `[1, L, 1]` booleans.
fn flags(v: &[bool]) -> Result<Array> {
    let ints: Vec<i32> = v.iter().map(|&b| b as i32).collect();
    Ok(Array::from_i32(&ints, &[1, v.len() as i32, 1])?.greater(&Array::scalar_i32(0)?)?)
}

