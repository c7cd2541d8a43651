//! Node hash, name hash and volume ID (DESIGN.md 3.1).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::Error;

/// Longest accepted volume name in bytes. CSI requires 128 to be accepted; Kubernetes names its
/// volumes `pvc-<uuid>`. Anything near this bound is a caller bug, not a name.
pub const MAX_NAME_BYTES: usize = 1024;

/// Longest accepted node name in bytes (CSI node IDs may be 256 bytes; Kubernetes names 253).
pub const MAX_NODE_NAME_BYTES: usize = 256;

const NODE_HASH_BYTES: usize = 16;
const NAME_HASH_BYTES: usize = 32;
const VERSION_PREFIX: &str = "v1.";

/// The node's topology value: the first 16 bytes of SHA-256 of the Kubernetes node name,
/// rendered as 32 lowercase hex characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeHash([u8; NODE_HASH_BYTES]);

impl NodeHash {
    /// Hashes a node name. The name is validated: it must be non-empty, hold no NUL and be at
    /// most [`MAX_NODE_NAME_BYTES`] long.
    pub fn of(node_name: &str) -> Result<Self, Error> {
        validate_text("node name", node_name, MAX_NODE_NAME_BYTES)?;
        let digest = Sha256::digest(node_name.as_bytes());
        let mut bytes = [0u8; NODE_HASH_BYTES];
        bytes.copy_from_slice(&digest[..NODE_HASH_BYTES]);
        Ok(Self(bytes))
    }

    /// The raw 16 bytes.
    pub fn as_bytes(&self) -> &[u8; NODE_HASH_BYTES] {
        &self.0
    }
}

impl fmt::Display for NodeHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl FromStr for NodeHash {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        decode_hex(s)
            .map(Self)
            .ok_or_else(|| Error::InvalidArgument {
                field: "node hash",
                value: truncated(s),
                reason: "must be 32 lowercase hex characters",
            })
    }
}

/// The full SHA-256 of a CSI volume name, rendered as 64 lowercase hex characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NameHash([u8; NAME_HASH_BYTES]);

impl NameHash {
    /// Hashes a volume name after validating it (see [`validate_name`]).
    pub fn of(name: &str) -> Result<Self, Error> {
        validate_name(name)?;
        Ok(Self(Sha256::digest(name.as_bytes()).into()))
    }

    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; NAME_HASH_BYTES] {
        &self.0
    }
}

impl fmt::Display for NameHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

/// A local volume's ID: `v1.<node-hash>.<name-hash>`.
///
/// Parsing is strict: exactly the `v1.` prefix, 32 and 64 lowercase hex characters and the two
/// dots. Display renders the same form, so parse and render round-trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct VolumeId {
    node: NodeHash,
    name: NameHash,
}

impl VolumeId {
    /// Length of a rendered volume ID in bytes.
    pub const LEN: usize = VERSION_PREFIX.len() + 2 * NODE_HASH_BYTES + 1 + 2 * NAME_HASH_BYTES;

    /// The ID of the volume called `name` on the node with hash `node`.
    pub fn new(node: NodeHash, name: &str) -> Result<Self, Error> {
        Ok(Self {
            node,
            name: NameHash::of(name)?,
        })
    }

    /// Builds an ID from its two hashes.
    pub fn from_parts(node: NodeHash, name: NameHash) -> Self {
        Self { node, name }
    }

    /// The hash of the node that owns the volume.
    pub fn node_hash(&self) -> NodeHash {
        self.node
    }

    /// The hash of the volume's CSI name.
    pub fn name_hash(&self) -> NameHash {
        self.name
    }
}

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{VERSION_PREFIX}{}.{}", self.node, self.name)
    }
}

impl FromStr for VolumeId {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let invalid = |reason| Error::InvalidArgument {
            field: "volume id",
            value: truncated(s),
            reason,
        };
        let rest = s
            .strip_prefix(VERSION_PREFIX)
            .ok_or_else(|| invalid("must start with \"v1.\""))?;
        let (node, name) = rest
            .split_once('.')
            .ok_or_else(|| invalid("must be v1.<32 hex>.<64 hex>"))?;
        let node = decode_hex(node)
            .ok_or_else(|| invalid("node hash must be 32 lowercase hex characters"))?;
        let name = decode_hex(name)
            .ok_or_else(|| invalid("name hash must be 64 lowercase hex characters"))?;
        Ok(Self {
            node: NodeHash(node),
            name: NameHash(name),
        })
    }
}

impl TryFrom<String> for VolumeId {
    type Error = Error;

    fn try_from(s: String) -> Result<Self, Error> {
        s.parse()
    }
}

impl From<VolumeId> for String {
    fn from(id: VolumeId) -> String {
        id.to_string()
    }
}

/// Checks a CSI volume name: non-empty, no NUL, at most [`MAX_NAME_BYTES`] bytes.
pub fn validate_name(name: &str) -> Result<(), Error> {
    validate_text("volume name", name, MAX_NAME_BYTES)
}

pub(crate) fn validate_text(field: &'static str, s: &str, max: usize) -> Result<(), Error> {
    let invalid = |reason| Error::InvalidArgument {
        field,
        value: truncated(s),
        reason,
    };
    if s.is_empty() {
        return Err(invalid("must not be empty"));
    }
    if s.len() > max {
        return Err(invalid("is too long"));
    }
    if s.contains('\0') {
        return Err(invalid("must not contain NUL"));
    }
    Ok(())
}

/// A value short enough to put in an error message: at most 80 characters, NULs escaped by
/// the `Debug` rendering the messages use.
pub(crate) fn truncated(s: &str) -> String {
    const MAX: usize = 80;
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &s[..end], s.len())
}

fn write_hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    f.write_str(&out)
}

/// Decodes exactly `2 * N` lowercase hex characters.
fn decode_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        }
    }
    let s = s.as_bytes();
    if s.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (byte, pair) in out.iter_mut().zip(s.chunks_exact(2)) {
        let [hi, lo] = pair else { return None };
        *byte = (nibble(*hi)? << 4) | nibble(*lo)?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn node_hash_is_the_first_16_bytes_of_sha256() {
        // sha256("node-a") computed independently with `printf node-a | sha256sum`.
        let hash = NodeHash::of("node-a").unwrap();
        let full = format!("{:x}", Sha256::digest(b"node-a"));
        assert_eq!(hash.to_string(), full[..32]);
        assert_eq!(hash.to_string().len(), 32);
    }

    #[test]
    fn volume_id_has_the_documented_shape() {
        let node = NodeHash::of("node-a").unwrap();
        let id = VolumeId::new(node, "pvc-1").unwrap();
        let s = id.to_string();
        assert_eq!(s.len(), VolumeId::LEN);
        let full = format!("{:x}", Sha256::digest(b"pvc-1"));
        assert_eq!(s, format!("v1.{node}.{full}"));
        assert_eq!(s.parse::<VolumeId>().unwrap(), id);
    }

    #[test]
    fn parser_rejects_near_misses() {
        let good = VolumeId::new(NodeHash::of("n").unwrap(), "x")
            .unwrap()
            .to_string();
        let upper = good.to_uppercase().replacen("V1", "v1", 1);
        let cases = [
            String::new(),
            "v1.".to_owned(),
            upper,
            good.replacen("v1.", "v2.", 1),
            format!("{good}0"),
            good[..good.len() - 1].to_owned(),
            good.replacen('.', "", 2),
            format!(" {good}"),
            good.replacen('.', "..", 2),
            good.replace(&good[3..5], "g0"),
        ];
        for case in cases {
            let err = case.parse::<VolumeId>().unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::InvalidArgument {
                        field: "volume id",
                        ..
                    }
                ),
                "{case}"
            );
        }
    }

    #[test]
    fn names_are_validated() {
        assert!(NameHash::of("").is_err());
        assert!(NameHash::of("a\0b").is_err());
        assert!(NameHash::of(&"x".repeat(10 * 1024)).is_err());
        assert!(NameHash::of(&"x".repeat(MAX_NAME_BYTES)).is_ok());
        let err = NameHash::of(&"é".repeat(600)).unwrap_err().to_string();
        assert!(err.contains("bytes"), "{err}");
    }

    proptest! {
        #[test]
        fn render_then_parse_round_trips(node in any::<[u8; 16]>(), name in any::<[u8; 32]>()) {
            let id = VolumeId::from_parts(NodeHash(node), NameHash(name));
            let rendered = id.to_string();
            prop_assert_eq!(rendered.parse::<VolumeId>().unwrap(), id);
            prop_assert_eq!(rendered.len(), VolumeId::LEN);
        }

        #[test]
        fn parse_never_panics_and_accepts_only_canonical(s in "\\PC{0,120}") {
            if let Ok(id) = s.parse::<VolumeId>() {
                prop_assert_eq!(id.to_string(), s);
            }
        }
    }
}
