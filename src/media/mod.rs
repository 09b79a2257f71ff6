//! Images (and audio) in prompts, the parts that need no MLX and run on the
//! caller's thread at submit: decoding (`decode`), Pillow-exact resizing
//! (`resize`), the checkpoint's processors (`process`), the prompt
//! expansion (`spec`) and the messages' media parts (`parts`).

pub mod audio;
pub mod decode;
pub mod parts;
pub mod process;
pub mod resize;
pub mod spec;

pub use audio::{decode_wav, from_samples, Audio, AudioProcessor};
pub use decode::{decode, from_pixels, Limits, PixelFormat, Rgb};
pub use process::ImageProcessor;
pub use spec::MediaSpec;

use std::ops::Range;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MediaKind {
    Image,
    Audio,
}

impl MediaKind {
    pub fn name(self) -> &'static str {
        match self {
            MediaKind::Image => "image",
            MediaKind::Audio => "audio",
        }
    }
}

/// One processed image or audio clip: what its tower reads (`data`,
/// row-major `shape`: Gemma 3 `[3, S, S]` pixels), its patch grid
/// `(t, h, w)` where the tower takes one, how many soft tokens it fills in
/// the prompt, and the content hash of the decoded media with the processing
/// parameters (the encoder cache's and the prompt cache's key).
#[derive(Debug, Clone)]
pub struct MediaItem {
    pub kind: MediaKind,
    pub data: Vec<f32>,
    pub shape: Vec<usize>,
    pub grid: [usize; 3],
    /// Leading rows of `data` that are real (audio: the frames before the
    /// padding; all rows elsewhere).
    pub valid: usize,
    pub tokens: usize,
    pub hash: [u8; 32],
}

/// The processed media of one prompt in document order, and where they go
/// (plain data: made on the caller's thread, read by the scheduler).
#[derive(Debug, Default)]
pub struct MediaPrompt {
    pub items: Vec<MediaItem>,
    /// Per item: the prompt positions of its soft tokens.
    pub spans: Vec<Range<usize>>,
    /// Prompt positions whose embedding is zero (Gemma 3: the pad token).
    pub zero: Vec<usize>,
    /// Multimodal RoPE (Qwen3-VL): each prompt position's (t, h, w)
    /// position, and the offset decoding continues with.
    pub mrope: Option<(Vec<[i32; 3]>, i32)>,
    /// Spans whose tokens attend to one another both ways (Gemma 4's images).
    pub blocks: Vec<Range<usize>>,
}

impl MediaPrompt {
    /// The prompt-cache key of the prompt: `prompt` with the soft token `j`
    /// of item `i` replaced by `0x8000_0000 | mix(hash_i, j)`. Real token
    /// ids are below 2^31, so text never matches them; the same text with
    /// another image differs from the image's first token on, and the same
    /// media and text give the same key.
    pub fn key(&self, prompt: &[u32]) -> Vec<u32> {
        let mut key = prompt.to_vec();
        for (item, span) in self.items.iter().zip(&self.spans) {
            let h = u64::from_le_bytes(item.hash[..8].try_into().expect("8 bytes"));
            for (j, k) in key[span.clone()].iter_mut().enumerate() {
                // splitmix64 of the hash and the position within the item.
                let mut z = h ^ (j as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                *k = 0x8000_0000 | ((z ^ (z >> 31)) as u32 & 0x7fff_ffff);
            }
        }
        key
    }
}
