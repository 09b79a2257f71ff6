//! Images in prompts, the parts that need no MLX and run on the caller's
//! thread at submit: decoding (`decode`), Pillow-exact resizing (`resize`),
//! the checkpoint's image processor (`process`), the prompt expansion
//! (`spec`) and the messages' media parts (`parts`).

pub mod decode;
pub mod parts;
pub mod process;
pub mod resize;
pub mod spec;

pub use decode::{decode, from_pixels, Limits, PixelFormat, Rgb};
pub use process::{ImageProcessor, PixelTensor};
pub use spec::MediaSpec;

/// The prompt-cache key of a media prompt: `prompt` with the soft tokens of
/// image `i` (the `i`-th run of `per_image` ids `soft`) replaced by
/// `0x8000_0000 | mix(hash_i, j)` for its `j`-th token. Real token ids are
/// below 2^31, so text never matches them; the same text with another image
/// differs from the image's first token on, and the same image and text
/// give the same key.
pub fn prefix_key(prompt: &[u32], soft: u32, per_image: usize, images: &[PixelTensor]) -> Vec<u32> {
    let mut key = prompt.to_vec();
    let mut n = 0usize;
    for k in key.iter_mut().filter(|t| **t == soft) {
        let (i, j) = (n / per_image.max(1), n % per_image.max(1));
        let h = images.get(i).map_or(0, |img| u64::from_le_bytes(img.hash[..8].try_into().expect("8 bytes")));
        // splitmix64 of the image hash and the position within the image.
        let mut z = h ^ (j as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        *k = 0x8000_0000 | ((z ^ (z >> 31)) as u32 & 0x7fff_ffff);
        n += 1;
    }
    key
}

/// The processed images of one prompt, in document order (plain data: made
/// on the caller's thread, read by the scheduler).
#[derive(Debug, Default)]
pub struct MediaPrompt {
    pub images: Vec<PixelTensor>,
}
