//! An error and its causes as one line, `outer: cause: cause`: for a log field, a gRPC status
//! message, a report a program reads. The one formatter of the workspace's crates (the tests
//! use it through `test-support`).
//!
//! Every error type in this workspace keeps its cause in [`Error::source`] and leaves it out of
//! its own message, so the chain is where the whole story is told.
//!
//! ```
//! use std::io;
//!
//! #[derive(Debug)]
//! struct Open(io::Error);
//!
//! impl std::fmt::Display for Open {
//!     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
//!         f.write_str("cannot open the record")
//!     }
//! }
//!
//! impl std::error::Error for Open {
//!     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
//!         Some(&self.0)
//!     }
//! }
//!
//! let error = Open(io::Error::other("disk on fire"));
//! assert_eq!(error_text::chain(&error), "cannot open the record: disk on fire");
//! assert_eq!(format!("{}", error_text::Chain(&error)), "cannot open the record: disk on fire");
//! ```

use std::error::Error;
use std::fmt;

/// Displays an error followed by each of its sources, separated by `": "`.
#[derive(Clone, Copy)]
pub struct Chain<'a>(pub &'a dyn Error);

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

impl fmt::Debug for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// An error followed by each of its sources, `outer: cause: cause`.
pub fn chain(error: &dyn Error) -> String {
    Chain(error).to_string()
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<dyn Error + 'static>>);

    impl fmt::Display for Layer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl Error for Layer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref()
        }
    }

    #[test]
    fn every_cause_is_written_once_in_order() {
        let inner = Layer("inner", Some(Box::new(io::Error::other("os"))));
        let outer = Layer("outer", Some(Box::new(inner)));
        assert_eq!(chain(&outer), "outer: inner: os");
        assert_eq!(chain(&Layer("alone", None)), "alone");
        assert_eq!(format!("{:?}", Chain(&outer)), "outer: inner: os");
    }
}
