//! Text in and out of the model: tokenizer (HF tokenizer.json or GGUF vocab),
//! chat templates (Jinja, HF-compatible), incremental detokenization,
//! stop-string matching, and output channels (reasoning, tool calls). Everything here is plain CPU code with no MLX state,
//! so it is `Send + Sync` and runs on host threads.

mod channels;
mod detok;
mod error;
mod gguf;
mod hf_jinja;
mod stop;
mod strftime;
mod template;
mod tokenizer;

#[cfg(test)]
mod oracle_tests;
#[cfg(test)]
pub(crate) use tokenizer::tests::tiny_byte_level;

pub use channels::{ChannelParser, OutputFormat, Piece, ToolFormat};
pub use detok::IncrementalDecoder;
pub use error::TextError;
pub use gguf::GgufVocab;
pub use stop::{StopMatcher, StopResult};
pub use template::ChatTemplate;
pub use tokenizer::{HfTokenizerConfig, Tokenizer};
