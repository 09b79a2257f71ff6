use std::fmt;

/// Errors of the text layer. Every message names what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextError {
    /// A file could not be read or parsed (path, reason).
    File(String, String),
    /// A GGUF metadata key is missing or has the wrong type.
    Gguf(String),
    /// The vocabulary kind or pre-tokenizer is not supported.
    Unsupported(String),
    /// An error raised by the `tokenizers` library.
    Tokenizer(String),
    /// A token id outside the vocabulary.
    UnknownTokenId(u32),
    /// The chat template does not compile.
    TemplateSyntax(String),
    /// The chat template failed while rendering (including `raise_exception`).
    TemplateRender(String),
    /// The messages/tools/extra arguments given to a template are malformed.
    InvalidMessages(String),
    /// An empty stop string (its index in the list).
    EmptyStopString(usize),
}

impl fmt::Display for TextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TextError::File(path, why) => write!(f, "cannot load {path}: {why}"),
            TextError::Gguf(why) => write!(f, "GGUF tokenizer metadata: {why}"),
            TextError::Unsupported(why) => write!(f, "unsupported tokenizer: {why}"),
            TextError::Tokenizer(why) => write!(f, "tokenizer: {why}"),
            TextError::UnknownTokenId(id) => write!(f, "token id {id} is not in the vocabulary"),
            TextError::TemplateSyntax(why) => write!(f, "chat template does not compile: {why}"),
            TextError::TemplateRender(why) => write!(f, "chat template error: {why}"),
            TextError::InvalidMessages(why) => write!(f, "invalid chat messages: {why}"),
            TextError::EmptyStopString(i) => write!(f, "stop string #{i} is empty"),
        }
    }
}

impl std::error::Error for TextError {}

impl From<tokenizers::Error> for TextError {
    fn from(e: tokenizers::Error) -> Self {
        TextError::Tokenizer(e.to_string())
    }
}
