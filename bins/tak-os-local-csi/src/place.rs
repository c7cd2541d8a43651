//! Where a publication target lies: below kubelet's root, or a trusted consumer's slot.

use std::path::Path;

use mounter::TargetRoot;

use crate::error::Error;

/// Longest generation name in a consumer target.
const MAX_GENERATION_BYTES: usize = 128;

/// The kind of a publication target.
#[derive(Clone, Copy, Debug)]
pub enum Place<'a> {
    /// An ordinary target below kubelet's root.
    Kubelet(&'a TargetRoot),
    /// A trusted consumer's `<root>/<generation>/<replica>/mount`.
    Consumer(&'a TargetRoot),
}

impl<'a> Place<'a> {
    /// Classifies `target`; anything outside both roots, or a malformed consumer target, is an
    /// error (`INVALID_ARGUMENT`).
    pub fn of(
        target: &Path,
        kubelet: &'a TargetRoot,
        consumer: Option<&'a TargetRoot>,
    ) -> Result<Self, Error> {
        if let Some(root) = consumer
            && root.contains(target)
        {
            return match consumer_target_problem(root.path(), target) {
                None => Ok(Place::Consumer(root)),
                Some(problem) => Err(Error::MalformedConsumerTarget {
                    target: target.to_owned(),
                    problem,
                }),
            };
        }
        if kubelet.contains(target) {
            return Ok(Place::Kubelet(kubelet));
        }
        Err(Error::OutsideRoots {
            target: target.to_owned(),
            kubelet_root: kubelet.path().to_owned(),
            consumer_root: consumer.map(|c| c.path().to_owned()),
        })
    }

    /// The root the target is resolved below.
    pub fn root(self) -> &'a TargetRoot {
        match self {
            Place::Kubelet(root) | Place::Consumer(root) => root,
        }
    }

    /// Whether this is a trusted consumer's target.
    pub fn is_consumer(self) -> bool {
        matches!(self, Place::Consumer(_))
    }
}

/// Why `target` is not exactly `<root>/<generation>/<replica>/mount`, if it is not.
pub fn consumer_target_problem(root: &Path, target: &Path) -> Option<&'static str> {
    let Ok(rel) = target.strip_prefix(root) else {
        return Some("it is not below the root");
    };
    let parts: Vec<&str> = match rel.iter().map(|c| c.to_str()).collect::<Option<Vec<_>>>() {
        Some(parts) => parts,
        None => return Some("it is not UTF-8"),
    };
    let [generation, replica, last] = parts.as_slice() else {
        return Some("it must have exactly three components below the root");
    };
    if generation.is_empty()
        || generation.len() > MAX_GENERATION_BYTES
        || !generation
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Some("the generation must be 1 to 128 ASCII letters, digits or hyphens");
    }
    if !valid_replica(replica) {
        return Some(
            "the replica must be r0 to r3, optionally followed by - and 12 lowercase hex digits",
        );
    }
    if *last != "mount" {
        return Some("the last component must be `mount`");
    }
    None
}

fn valid_replica(replica: &str) -> bool {
    let bytes = replica.as_bytes();
    let index_ok = bytes.len() >= 2 && bytes[0] == b'r' && (b'0'..=b'3').contains(&bytes[1]);
    match &bytes[2.min(bytes.len())..] {
        [] => index_ok,
        [b'-', hex @ ..] => {
            index_ok
                && hex.len() == 12
                && hex
                    .iter()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumer_targets_follow_the_pattern_exactly() {
        let root = Path::new("/var/lib/tak-os/consumers");
        let ok = |rel: &str| consumer_target_problem(root, &root.join(rel)).is_none();
        assert!(ok("gen-1/r0/mount"));
        assert!(ok("G/r3-0123456789ab/mount"));
        assert!(ok(&format!("{}/r1/mount", "a".repeat(128))));
        assert!(!ok(&format!("{}/r1/mount", "a".repeat(129))));
        assert!(!ok("gen/r4/mount"));
        assert!(!ok("gen/r0-0123456789AB/mount"));
        assert!(!ok("gen/r0-0123456789a/mount"));
        assert!(!ok("gen/r0/mnt"));
        assert!(!ok("gen/r0/mount/extra"));
        assert!(!ok("gen_1/r0/mount"));
        assert!(!ok("r0/mount"));
    }

    #[test]
    fn targets_are_classified_by_root() {
        let kubelet = TargetRoot::new("/var/lib/kubelet").unwrap();
        let consumer = TargetRoot::new("/var/lib/tak-os/consumers").unwrap();
        let place = |p: &str| Place::of(Path::new(p), &kubelet, Some(&consumer));
        assert!(matches!(
            place("/var/lib/kubelet/pods/x/mount"),
            Ok(Place::Kubelet(_))
        ));
        assert!(matches!(
            place("/var/lib/tak-os/consumers/g/r0/mount"),
            Ok(Place::Consumer(_))
        ));
        let err = place("/tmp/x").unwrap_err();
        assert!(matches!(err, Error::OutsideRoots { .. }), "{err}");
        assert!(err.to_string().contains("/var/lib/kubelet"), "{err}");
        assert!(matches!(
            place("/var/lib/tak-os/consumers/g/r0"),
            Err(Error::MalformedConsumerTarget { .. })
        ));
    }
}
