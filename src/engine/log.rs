//! Per-engine logging: a minimum level and a sink (a host callback, or
//! standard error by default). No global logger.

use std::fmt;
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
}

impl LogLevel {
    /// `MLXRT_LOG` = off | error | warn | info | debug (default warn).
    fn from_env() -> Option<LogLevel> {
        match std::env::var("MLXRT_LOG").ok().as_deref() {
            Some("off") => None,
            Some("error") => Some(LogLevel::Error),
            Some("info") => Some(LogLevel::Info),
            Some("debug") => Some(LogLevel::Debug),
            _ => Some(LogLevel::Warn),
        }
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
        })
    }
}

pub type LogFn = Arc<dyn Fn(LogLevel, &str) + Send + Sync>;

#[derive(Clone)]
pub struct Logger {
    /// Messages above this level are dropped; None = nothing is logged.
    min: Option<LogLevel>,
    sink: LogFn,
}

impl Logger {
    /// Standard error, at the level `MLXRT_LOG` names (default warn).
    pub fn stderr() -> Logger {
        Logger { min: LogLevel::from_env(), sink: Arc::new(|l, m| eprintln!("[mlxrt {l}] {m}")) }
    }

    /// A host-provided sink with a minimum level.
    pub fn new(min: Option<LogLevel>, sink: LogFn) -> Logger {
        Logger { min, sink }
    }

    pub fn enabled(&self, level: LogLevel) -> bool {
        self.min.is_some_and(|m| level <= m)
    }

    pub fn log(&self, level: LogLevel, msg: impl AsRef<str>) {
        if self.enabled(level) {
            (self.sink)(level, msg.as_ref());
        }
    }
}

impl Default for Logger {
    fn default() -> Self {
        Logger::stderr()
    }
}

impl fmt::Debug for Logger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Logger(min: {:?})", self.min)
    }
}
