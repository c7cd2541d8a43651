//! The mount epoch: the 128-bit fencing token of one RWO claim.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::Error;

/// The random 128-bit mount epoch of one claim (DESIGN.md 1): a fencing token the workers check
/// on every read and mutation. It is not a credential, so it may be shown.
///
/// Its text form is exactly 32 lowercase hexadecimal digits; [`FromStr`] accepts nothing else
/// (no uppercase, no prefix, no whitespace), so every epoch has one spelling on disk.
///
/// This crate does not generate epochs: the caller draws 16 random bytes and passes them to
/// [`MountEpoch::from_bytes`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MountEpoch([u8; 16]);

impl MountEpoch {
    /// The epoch made of these 16 bytes.
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// The epoch's 16 bytes.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Display for MountEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for MountEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MountEpoch({self})")
    }
}

impl FromStr for MountEpoch {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let digits = s.as_bytes();
        if digits.len() != 32 {
            return Err(Error::InvalidEpoch {
                reason: format!("it has {} bytes, not 32 hex digits", digits.len()),
            });
        }
        let nibble = |i: usize| match digits[i] {
            b @ b'0'..=b'9' => Ok(b - b'0'),
            b @ b'a'..=b'f' => Ok(b - b'a' + 10),
            _ => Err(Error::InvalidEpoch {
                reason: format!("byte {i} is not a lowercase hex digit"),
            }),
        };
        let mut bytes = [0u8; 16];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = (nibble(2 * i)? << 4) | nibble(2 * i + 1)?;
        }
        Ok(Self(bytes))
    }
}

impl Serialize for MountEpoch {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MountEpoch {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = MountEpoch;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("32 lowercase hex digits")
            }

            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<MountEpoch, E> {
                s.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn renders_lowercase_hex() {
        let epoch = MountEpoch::from_bytes([
            0x00, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0xfe, 0xdc, 0xba, 0x98, 0x76,
            0x54, 0x32,
        ]);
        assert_eq!(epoch.to_string(), "000123456789abcdeffedcba98765432");
        assert_eq!(
            format!("{epoch:?}"),
            "MountEpoch(000123456789abcdeffedcba98765432)"
        );
    }

    #[test]
    fn parse_is_strict() {
        let ok = "000123456789abcdeffedcba98765432";
        assert!(ok.parse::<MountEpoch>().is_ok());
        let refusal = |s: &str| s.parse::<MountEpoch>().unwrap_err().to_string();
        assert_eq!(
            refusal(&ok.to_uppercase()),
            "invalid mount epoch: byte 12 is not a lowercase hex digit"
        );
        assert_eq!(
            refusal("0x0123456789abcdeffedcba98765432"),
            "invalid mount epoch: byte 1 is not a lowercase hex digit"
        );
        assert_eq!(
            refusal(&format!("{ok} ")),
            "invalid mount epoch: it has 33 bytes, not 32 hex digits"
        );
        assert_eq!(
            refusal(""),
            "invalid mount epoch: it has 0 bytes, not 32 hex digits"
        );
        // 32 bytes but not 32 characters: a multi-byte character is not a digit.
        assert_eq!(
            refusal("é0123456789abcdeffedcba98765432"),
            "invalid mount epoch: byte 0 is not a lowercase hex digit"
        );
    }

    proptest! {
        #[test]
        fn display_then_parse_is_identity(bytes in any::<[u8; 16]>()) {
            let epoch = MountEpoch::from_bytes(bytes);
            prop_assert_eq!(epoch.to_string().parse::<MountEpoch>().unwrap(), epoch);
        }

        #[test]
        fn parse_accepts_only_its_own_rendering(s in "\\PC{0,40}") {
            if let Ok(epoch) = s.parse::<MountEpoch>() {
                prop_assert_eq!(epoch.to_string(), s);
            }
        }
    }
}
