//! The crate-wide error: a kind (mapped 1:1 to a C status code) and a message
//! that says what was wrong in terms the caller can act on.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidArgument,
    InvalidUtf8,
    InvalidJson,
    ModelLoad,
    Unsupported,
    Mlx,
    Busy,
    EnginePoisoned,
    Io,
    Internal,
    /// A host callback asked to stop (e.g. the model-load progress callback).
    Aborted,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into() }
    }
    pub fn invalid(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidArgument, message)
    }
    pub fn model(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::ModelLoad, message)
    }
    pub fn unsupported(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Unsupported, message)
    }
    pub fn internal(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Internal, message)
    }
    /// Prefixes the message with context ("loading model.safetensors: ...").
    pub fn context(mut self, ctx: impl fmt::Display) -> Error {
        self.message = format!("{ctx}: {}", self.message);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<crate::mlx::MlxError> for Error {
    fn from(e: crate::mlx::MlxError) -> Error {
        Error::new(ErrorKind::Mlx, e.to_string())
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::new(ErrorKind::Io, e.to_string())
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Error {
        Error::new(ErrorKind::InvalidJson, e.to_string())
    }
}

impl From<crate::text::TextError> for Error {
    fn from(e: crate::text::TextError) -> Error {
        use crate::text::TextError as T;
        let kind = match e {
            T::File(..) | T::Gguf(_) | T::TemplateSyntax(_) => ErrorKind::ModelLoad,
            T::Unsupported(_) => ErrorKind::Unsupported,
            _ => ErrorKind::InvalidArgument,
        };
        Error::new(kind, e.to_string())
    }
}
