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

/// The processed images of one prompt, in document order (plain data: made
/// on the caller's thread, read by the scheduler).
#[derive(Debug, Default)]
pub struct MediaPrompt {
    pub images: Vec<PixelTensor>,
}
