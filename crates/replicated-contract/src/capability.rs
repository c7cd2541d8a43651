//! Which volume capabilities the replicated node supports, by the volume's mode.
//!
//! | volume mode | access modes accepted | publications |
//! |---|---|---|
//! | `rwx` | MULTI_NODE_MULTI_WRITER | read-write unless `readonly` |
//! | `rwx` | MULTI_NODE_READER_ONLY | always read-only |
//! | `rwo` | SINGLE_NODE_WRITER, SINGLE_NODE_MULTI_WRITER (one contract) | read-write unless `readonly` |
//!
//! Block access, a file system type, mount flags, a volume mount group, SINGLE_NODE_SINGLE_WRITER
//! and every other mode are never supported (INVALID_ARGUMENT); a supported mode that the volume's
//! own mode does not allow "exceeds the volume's capabilities" (FAILED_PRECONDITION).

use csi_proto::v1::VolumeCapability;
use csi_proto::v1::volume_capability::AccessType;
use csi_proto::v1::volume_capability::access_mode::Mode;

use crate::context::VolumeMode;

/// An access mode this driver supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessMode {
    /// `MULTI_NODE_MULTI_WRITER`, for `rwx` volumes.
    MultiNodeMultiWriter,
    /// `MULTI_NODE_READER_ONLY`, for `rwx` volumes: every publication read-only.
    MultiNodeReaderOnly,
    /// `SINGLE_NODE_WRITER` or `SINGLE_NODE_MULTI_WRITER`, for `rwo` volumes: one node, any
    /// number of Pods on it.
    SingleNode,
}

impl AccessMode {
    /// Whether every publication must be read-only.
    pub fn read_only(self) -> bool {
        self == AccessMode::MultiNodeReaderOnly
    }

    /// The volume mode that allows this access mode.
    pub fn volume_mode(self) -> VolumeMode {
        match self {
            AccessMode::MultiNodeMultiWriter | AccessMode::MultiNodeReaderOnly => VolumeMode::Rwx,
            AccessMode::SingleNode => VolumeMode::Rwo,
        }
    }
}

/// Why a capability is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CapabilityError {
    /// Something this driver never supports (INVALID_ARGUMENT).
    #[error("{0}")]
    Unsupported(String),
    /// A supported access mode that the volume's mode does not allow (FAILED_PRECONDITION).
    #[error(
        "access mode {mode} exceeds the volume's capabilities: an {volume_mode} volume accepts {accepted}"
    )]
    ExceedsVolume {
        /// The CSI name of the mode asked for.
        mode: &'static str,
        /// The volume's mode.
        volume_mode: VolumeMode,
        /// The CSI names of the modes it accepts.
        accepted: &'static str,
    },
}

/// Checks a CSI capability against a volume of mode `volume_mode`.
pub fn check(
    capability: Option<&VolumeCapability>,
    volume_mode: VolumeMode,
) -> Result<AccessMode, CapabilityError> {
    let unsupported = |why: &str| CapabilityError::Unsupported(why.to_owned());
    let capability = capability.ok_or_else(|| unsupported("volume_capability is required"))?;
    let mount = match &capability.access_type {
        Some(AccessType::Mount(mount)) => mount,
        Some(AccessType::Block(_)) => {
            return Err(unsupported(
                "block access is not supported: replicated volumes are file systems",
            ));
        }
        None => return Err(unsupported("access_type is missing (mount is required)")),
    };
    if !mount.fs_type.is_empty() {
        return Err(CapabilityError::Unsupported(format!(
            "fs_type {:?} is not supported: the file system is always fuse.tak-os-replicated",
            mount.fs_type
        )));
    }
    if !mount.mount_flags.is_empty() {
        return Err(unsupported(
            "mount_flags are not supported: the mount options are fixed by the driver",
        ));
    }
    if !mount.volume_mount_group.is_empty() {
        return Err(unsupported("volume_mount_group is not supported"));
    }
    let mode = capability
        .access_mode
        .ok_or_else(|| unsupported("access_mode is required"))?
        .mode;
    let (access, name) = match Mode::try_from(mode) {
        Ok(Mode::MultiNodeMultiWriter) => {
            (AccessMode::MultiNodeMultiWriter, "MULTI_NODE_MULTI_WRITER")
        }
        Ok(Mode::MultiNodeReaderOnly) => {
            (AccessMode::MultiNodeReaderOnly, "MULTI_NODE_READER_ONLY")
        }
        Ok(Mode::SingleNodeWriter) => (AccessMode::SingleNode, "SINGLE_NODE_WRITER"),
        Ok(Mode::SingleNodeMultiWriter) => (AccessMode::SingleNode, "SINGLE_NODE_MULTI_WRITER"),
        Ok(Mode::SingleNodeSingleWriter) => {
            return Err(unsupported(
                "access mode SINGLE_NODE_SINGLE_WRITER is not supported (ReadWriteOncePod is not offered)",
            ));
        }
        Ok(other @ (Mode::Unknown | Mode::SingleNodeReaderOnly | Mode::MultiNodeSingleWriter)) => {
            return Err(CapabilityError::Unsupported(format!(
                "access mode {} is not supported",
                other.as_str_name()
            )));
        }
        Err(_) => {
            return Err(CapabilityError::Unsupported(format!(
                "access mode {mode} is not a CSI access mode"
            )));
        }
    };
    if access.volume_mode() != volume_mode {
        return Err(CapabilityError::ExceedsVolume {
            mode: name,
            volume_mode,
            accepted: match volume_mode {
                VolumeMode::Rwx => "MULTI_NODE_MULTI_WRITER or MULTI_NODE_READER_ONLY",
                VolumeMode::Rwo => "SINGLE_NODE_WRITER or SINGLE_NODE_MULTI_WRITER",
            },
        });
    }
    Ok(access)
}

#[cfg(test)]
mod tests {
    use csi_proto::v1::volume_capability::{AccessMode as CsiAccessMode, BlockVolume, MountVolume};

    use super::*;

    fn mount(mode: Mode) -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(CsiAccessMode { mode: mode as i32 }),
            access_type: Some(AccessType::Mount(MountVolume::default())),
        }
    }

    #[test]
    fn each_volume_mode_accepts_its_access_modes_and_refuses_the_others_as_exceeding() {
        let table = [
            (
                Mode::MultiNodeMultiWriter,
                VolumeMode::Rwx,
                Some(AccessMode::MultiNodeMultiWriter),
            ),
            (
                Mode::MultiNodeReaderOnly,
                VolumeMode::Rwx,
                Some(AccessMode::MultiNodeReaderOnly),
            ),
            (Mode::SingleNodeWriter, VolumeMode::Rwx, None),
            (Mode::SingleNodeMultiWriter, VolumeMode::Rwx, None),
            (
                Mode::SingleNodeWriter,
                VolumeMode::Rwo,
                Some(AccessMode::SingleNode),
            ),
            (
                Mode::SingleNodeMultiWriter,
                VolumeMode::Rwo,
                Some(AccessMode::SingleNode),
            ),
            (Mode::MultiNodeMultiWriter, VolumeMode::Rwo, None),
            (Mode::MultiNodeReaderOnly, VolumeMode::Rwo, None),
        ];
        for (mode, volume_mode, expected) in table {
            let result = check(Some(&mount(mode)), volume_mode);
            match expected {
                Some(access) => assert_eq!(result, Ok(access), "{mode:?} on {volume_mode}"),
                None => assert!(
                    matches!(result, Err(CapabilityError::ExceedsVolume { .. })),
                    "{mode:?} on {volume_mode}: {result:?}"
                ),
            }
        }
        assert!(AccessMode::MultiNodeReaderOnly.read_only());
        assert!(!AccessMode::SingleNode.read_only());
    }

    #[test]
    fn what_is_never_supported_is_refused_whatever_the_volume_mode() {
        let mut block = mount(Mode::MultiNodeMultiWriter);
        block.access_type = Some(AccessType::Block(BlockVolume::default()));
        let with = |f: fn(&mut MountVolume)| {
            let mut mount_volume = MountVolume::default();
            f(&mut mount_volume);
            VolumeCapability {
                access_mode: Some(CsiAccessMode {
                    mode: Mode::MultiNodeMultiWriter as i32,
                }),
                access_type: Some(AccessType::Mount(mount_volume)),
            }
        };
        let mut no_mode = mount(Mode::MultiNodeMultiWriter);
        no_mode.access_mode = None;
        let mut unknown_number = mount(Mode::MultiNodeMultiWriter);
        unknown_number.access_mode = Some(CsiAccessMode { mode: 99 });
        let cases = [
            (block, "block access"),
            (with(|m| m.fs_type = "ext4".into()), "fs_type \"ext4\""),
            (
                with(|m| m.mount_flags = vec!["noexec".into()]),
                "mount_flags",
            ),
            (
                with(|m| m.volume_mount_group = "1000".into()),
                "volume_mount_group",
            ),
            (
                mount(Mode::SingleNodeSingleWriter),
                "SINGLE_NODE_SINGLE_WRITER",
            ),
            (mount(Mode::SingleNodeReaderOnly), "SINGLE_NODE_READER_ONLY"),
            (
                mount(Mode::MultiNodeSingleWriter),
                "MULTI_NODE_SINGLE_WRITER",
            ),
            (mount(Mode::Unknown), "UNKNOWN"),
            (no_mode, "access_mode is required"),
            (unknown_number, "99"),
        ];
        for volume_mode in [VolumeMode::Rwx, VolumeMode::Rwo] {
            for (capability, expected) in &cases {
                let error = check(Some(capability), volume_mode).unwrap_err();
                assert!(
                    matches!(&error, CapabilityError::Unsupported(text) if text.contains(expected)),
                    "{expected}: {error:?}"
                );
            }
            assert!(matches!(
                check(None, volume_mode),
                Err(CapabilityError::Unsupported(_))
            ));
        }
    }
}
