//! Which volume capabilities the local driver supports, and what they mean for a bind mount.

use csi_proto::v1::VolumeCapability;
use csi_proto::v1::volume_capability::AccessType;
use csi_proto::v1::volume_capability::access_mode::Mode;
use mounter::{Atime, BindOptions, MountAttrs};

/// Mount flags a publication may carry. Anything else would need a filesystem of its own.
pub const MOUNT_FLAG_WHITELIST: &[&str] = &[
    "ro",
    "nosuid",
    "nodev",
    "noexec",
    "noatime",
    "nodiratime",
    "relatime",
];

/// The access modes of a node-local volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessMode {
    /// `SINGLE_NODE_WRITER`: read-write, any number of targets on this node.
    SingleNodeWriter,
    /// `SINGLE_NODE_READER_ONLY`: always mounted read-only.
    SingleNodeReaderOnly,
    /// `SINGLE_NODE_SINGLE_WRITER` (ReadWriteOncePod): one publication at a time.
    SingleNodeSingleWriter,
    /// `SINGLE_NODE_MULTI_WRITER`: read-write, any number of targets on this node.
    SingleNodeMultiWriter,
}

impl AccessMode {
    /// Whether every publication must be read-only.
    pub fn read_only(self) -> bool {
        self == AccessMode::SingleNodeReaderOnly
    }
}

/// A validated capability.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capability {
    /// Its access mode.
    pub access_mode: AccessMode,
    /// Its mount flags, in the caller's order.
    pub mount_flags: Vec<String>,
}

impl Capability {
    /// Checks a CSI capability; the error says what is unsupported and why.
    pub fn from_csi(capability: &VolumeCapability) -> Result<Self, String> {
        let mount = match &capability.access_type {
            Some(AccessType::Mount(mount)) => mount,
            Some(AccessType::Block(_)) => {
                return Err("block access is not supported: volumes are directories".to_owned());
            }
            None => return Err("access_type is missing (mount is required)".to_owned()),
        };
        if !mount.fs_type.is_empty() {
            return Err(format!(
                "fs_type {:?} is not supported: volumes are directories of the node's filesystem",
                mount.fs_type
            ));
        }
        if !mount.volume_mount_group.is_empty() {
            return Err("volume_mount_group is not supported (use fsGroup)".to_owned());
        }
        if let Some(flag) = mount
            .mount_flags
            .iter()
            .find(|f| !MOUNT_FLAG_WHITELIST.contains(&f.as_str()))
        {
            return Err(format!(
                "mount flag {flag:?} is not supported; allowed: {}",
                MOUNT_FLAG_WHITELIST.join(", ")
            ));
        }
        let mode = capability.access_mode.map(|m| Mode::try_from(m.mode));
        let access_mode = match mode {
            Some(Ok(Mode::SingleNodeWriter)) => AccessMode::SingleNodeWriter,
            Some(Ok(Mode::SingleNodeReaderOnly)) => AccessMode::SingleNodeReaderOnly,
            Some(Ok(Mode::SingleNodeSingleWriter)) => AccessMode::SingleNodeSingleWriter,
            Some(Ok(Mode::SingleNodeMultiWriter)) => AccessMode::SingleNodeMultiWriter,
            Some(Ok(
                mode @ (Mode::MultiNodeReaderOnly
                | Mode::MultiNodeSingleWriter
                | Mode::MultiNodeMultiWriter),
            )) => {
                return Err(format!(
                    "access mode {} is not supported: a local volume lives on one node",
                    mode.as_str_name()
                ));
            }
            Some(Ok(Mode::Unknown)) | None => return Err("access_mode is missing".to_owned()),
            Some(Err(_)) => return Err("access_mode holds an unknown value".to_owned()),
        };
        Ok(Capability {
            access_mode,
            mount_flags: mount.mount_flags.clone(),
        })
    }

    /// The form the store records for CreateVolume idempotency.
    pub fn to_record(&self) -> localstore::Capability {
        localstore::Capability {
            access_mode: self.mode_name().to_owned(),
            access_type: "mount".to_owned(),
            fs_type: String::new(),
            mount_flags: self.mount_flags.clone(),
        }
    }

    fn mode_name(&self) -> &'static str {
        match self.access_mode {
            AccessMode::SingleNodeWriter => Mode::SingleNodeWriter.as_str_name(),
            AccessMode::SingleNodeReaderOnly => Mode::SingleNodeReaderOnly.as_str_name(),
            AccessMode::SingleNodeSingleWriter => Mode::SingleNodeSingleWriter.as_str_name(),
            AccessMode::SingleNodeMultiWriter => Mode::SingleNodeMultiWriter.as_str_name(),
        }
    }

    /// The bind mount a publication with this capability gets; `readonly` is the request's
    /// field.
    pub fn bind_options(&self, readonly: bool) -> BindOptions {
        let has = |flag: &str| self.mount_flags.iter().any(|f| f == flag);
        let atime = if has("noatime") {
            Atime::Never
        } else if has("nodiratime") {
            Atime::NoDirectories
        } else {
            Atime::Relative
        };
        BindOptions {
            attrs: MountAttrs {
                read_only: readonly || self.access_mode.read_only() || has("ro"),
                nosuid: has("nosuid"),
                nodev: has("nodev"),
                noexec: has("noexec"),
            },
            atime,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_proto::v1::volume_capability::{self, MountVolume};

    fn cap(mode: Mode, flags: &[&str]) -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(volume_capability::AccessMode { mode: mode as i32 }),
            access_type: Some(AccessType::Mount(MountVolume {
                mount_flags: flags.iter().map(|f| (*f).to_owned()).collect(),
                ..Default::default()
            })),
        }
    }

    #[test]
    fn single_node_modes_are_accepted_and_multi_node_modes_refused() {
        for mode in [
            Mode::SingleNodeWriter,
            Mode::SingleNodeReaderOnly,
            Mode::SingleNodeSingleWriter,
            Mode::SingleNodeMultiWriter,
        ] {
            Capability::from_csi(&cap(mode, &[])).unwrap();
        }
        for mode in [
            Mode::MultiNodeReaderOnly,
            Mode::MultiNodeSingleWriter,
            Mode::MultiNodeMultiWriter,
        ] {
            let err = Capability::from_csi(&cap(mode, &[])).unwrap_err();
            assert!(err.contains(mode.as_str_name()), "{err}");
        }
        assert!(Capability::from_csi(&cap(Mode::Unknown, &[])).is_err());
    }

    #[test]
    fn block_fs_type_and_unlisted_flags_are_refused() {
        let block = VolumeCapability {
            access_mode: Some(volume_capability::AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(AccessType::Block(Default::default())),
        };
        assert!(Capability::from_csi(&block).unwrap_err().contains("block"));
        let mut ext4 = cap(Mode::SingleNodeWriter, &[]);
        if let Some(AccessType::Mount(m)) = &mut ext4.access_type {
            m.fs_type = "ext4".to_owned();
        }
        assert!(Capability::from_csi(&ext4).unwrap_err().contains("ext4"));
        let err = Capability::from_csi(&cap(Mode::SingleNodeWriter, &["suid"])).unwrap_err();
        assert!(err.contains("\"suid\""), "{err}");
    }

    #[test]
    fn flags_and_modes_shape_the_bind() {
        let c = Capability::from_csi(&cap(Mode::SingleNodeWriter, &["nosuid", "noatime"])).unwrap();
        let b = c.bind_options(false);
        assert!(b.attrs.nosuid && !b.attrs.read_only && b.atime == Atime::Never);
        assert!(c.bind_options(true).attrs.read_only);
        let ro = Capability::from_csi(&cap(Mode::SingleNodeReaderOnly, &[])).unwrap();
        assert!(
            ro.bind_options(false).attrs.read_only,
            "reader-only is always read-only"
        );
    }
}
