//! The error type of the `rdmx` command: a message saying what was being done, plus the
//! underlying error (verbs, posting, I/O, decoding) when there is one.

use std::error::Error as StdError;
use std::fmt;

/// Result with the tool's [`Error`].
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// An error of the `rdmx` command.
#[derive(Debug)]
pub(crate) struct Error {
    msg: String,
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

impl Error {
    /// An error with a message and no underlying cause.
    pub(crate) fn msg(msg: impl Into<String>) -> Self {
        Self {
            msg: msg.into(),
            source: None,
        }
    }

    /// An error with a message and an underlying cause.
    pub(crate) fn with_source(
        msg: impl Into<String>,
        source: impl StdError + Send + Sync + 'static,
    ) -> Self {
        Self {
            msg: msg.into(),
            source: Some(Box::new(source)),
        }
    }
}

impl fmt::Display for Error {
    /// Prints the message followed by the whole chain of causes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)?;
        let mut cause: Option<&(dyn StdError + 'static)> = match &self.source {
            Some(s) => Some(s.as_ref()),
            None => None,
        };
        while let Some(c) = cause {
            write!(f, ": {c}")?;
            cause = c.source();
        }
        Ok(())
    }
}

impl StdError for Error {}

/// Adds context to the errors of other crates.
pub(crate) trait ResultExt<T> {
    /// Wraps the error with "`what`: error".
    fn ctx(self, what: &str) -> Result<T>;
    /// Like [`ctx`](Self::ctx) with a message built only on error.
    fn with_ctx(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: StdError + Send + Sync + 'static> ResultExt<T> for std::result::Result<T, E> {
    fn ctx(self, what: &str) -> Result<T> {
        self.map_err(|e| Error::with_source(what, e))
    }

    fn with_ctx(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error::with_source(what(), e))
    }
}
