//! Bearer tokens, compared in constant time, replaceable while calls are in flight.

use std::sync::{Arc, RwLock};

use sha2::{Digest as _, Sha256};

/// The set of bearer tokens the worker accepts: usually one, two during a rotation.
///
/// Only SHA-256 digests are kept. A presented token is hashed and compared with every
/// accepted digest without an early exit, so the comparison takes the same time whatever
/// the token and whichever accepted token it matches.
#[derive(Clone, Default)]
pub struct Tokens {
    digests: Arc<RwLock<Arc<Vec<[u8; 32]>>>>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens").finish_non_exhaustive()
    }
}

fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

fn equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Tokens {
    /// Accepts exactly these tokens.
    pub fn new<T: AsRef<[u8]>>(tokens: impl IntoIterator<Item = T>) -> Self {
        let this = Self::default();
        this.replace(tokens);
        this
    }

    /// Replaces the accepted set; calls already authenticated are unaffected.
    pub fn replace<T: AsRef<[u8]>>(&self, tokens: impl IntoIterator<Item = T>) {
        let digests: Vec<[u8; 32]> = tokens
            .into_iter()
            .filter(|t| !t.as_ref().is_empty())
            .map(|t| digest(t.as_ref()))
            .collect();
        let mut guard = self
            .digests
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *guard = Arc::new(digests);
    }

    /// Whether an `Authorization` header value carries an accepted bearer token.
    pub fn accepts_header(&self, value: &[u8]) -> bool {
        let Some(token) = value.strip_prefix(b"Bearer ") else {
            return false;
        };
        let presented = digest(token.trim_ascii());
        let digests = Arc::clone(
            &self
                .digests
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        digests
            .iter()
            .fold(false, |found, known| found | equal(known, &presented))
    }
}

#[cfg(test)]
mod tests {
    use super::Tokens;

    #[test]
    fn accepts_only_bearer_tokens_in_the_set() {
        let tokens = Tokens::new(["old"]);
        assert!(tokens.accepts_header(b"Bearer old"));
        assert!(!tokens.accepts_header(b"Bearer new"));
        assert!(!tokens.accepts_header(b"old"));
        assert!(!tokens.accepts_header(b"Basic old"));
        tokens.replace(["old", "new"]);
        assert!(tokens.accepts_header(b"Bearer new"));
        tokens.replace(["new"]);
        assert!(!tokens.accepts_header(b"Bearer old"));
        assert!(!Tokens::new([""]).accepts_header(b"Bearer "));
    }
}
