//! Request IDs derived from the kernel's request, so that a request served again by another
//! owner of the connection makes the very same worker calls.
//!
//! A worker applies a mutation once per request ID and answers a repeat from its reply cache.
//! When an owner dies with kernel requests read but unanswered, the kernel sends them again
//! to the successor (`FUSE_NOTIFY_RESEND`, the resend bit set in their ID). For the worker to
//! recognise the successor's calls as repeats, each call's ID must follow from what both
//! owners know: the connection's nonce (drawn at mount and handed over with the connection),
//! the kernel's request ID without its resend and interrupt bits, and the call's index in the
//! request's fixed sequence of calls.

use std::fmt;

use fuse_wire::Unique;
use lease_client::protocol::{RandomUnavailable, RequestId};
use sha2::{Digest, Sha256};

/// A FUSE connection's nonce: 16 random bytes drawn when the volume is mounted and handed to
/// every later owner of the connection, so that request IDs never repeat across connections
/// (the kernel numbers every connection's requests from the same start).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ConnectionNonce(pub [u8; 16]);

impl ConnectionNonce {
    /// A fresh nonce from the operating system's random source.
    pub fn random() -> Result<Self, RandomUnavailable> {
        RequestId::random().map(|id| ConnectionNonce(id.0))
    }

    /// The request ID of call `index` made for kernel request `unique` on this connection:
    /// SHA-256 of the nonce, the request's ID with its resend and interrupt bits cleared
    /// (little-endian) and the index (little-endian), truncated to 16 bytes. The same for a
    /// request and its resend; different for every other request, index or connection.
    pub fn request_id(&self, unique: u64, index: u32) -> RequestId {
        let digest = Sha256::new()
            .chain_update(self.0)
            .chain_update(Unique(unique).id().to_le_bytes())
            .chain_update(index.to_le_bytes())
            .finalize();
        let mut id = [0u8; 16];
        id.copy_from_slice(&digest[..16]);
        RequestId(id)
    }
}

impl fmt::Debug for ConnectionNonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConnectionNonce(")?;
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        write!(f, ")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resend_or_interrupt_bit_keeps_the_id_and_anything_else_changes_it() {
        let nonce = ConnectionNonce([9; 16]);
        let id = nonce.request_id(42 << 1, 0);
        assert_eq!(nonce.request_id((42 << 1) | Unique::RESEND_BIT, 0), id);
        assert_eq!(nonce.request_id((42 << 1) | Unique::INTERRUPT_BIT, 0), id);
        assert_ne!(nonce.request_id(43 << 1, 0), id);
        assert_ne!(nonce.request_id(42 << 1, 1), id);
        assert_ne!(ConnectionNonce([8; 16]).request_id(42 << 1, 0), id);
    }

    #[test]
    fn the_derivation_is_pinned() {
        // Owners of two versions serve one connection across an upgrade: they must derive the
        // same IDs. SHA-256(16 zero bytes ‖ 2u64 LE ‖ 1u32 LE), first 16 bytes, computed with
        // Python's hashlib.
        let expected = "624bee70c5a2bd621b3443f8b7a5c45f";
        assert_eq!(
            ConnectionNonce([0; 16]).request_id(2, 1).to_string(),
            expected
        );
    }

    #[test]
    fn a_nonce_prints_as_hex() {
        assert_eq!(
            format!("{:?}", ConnectionNonce([0xab; 16])),
            format!("ConnectionNonce({})", "ab".repeat(16))
        );
    }
}
