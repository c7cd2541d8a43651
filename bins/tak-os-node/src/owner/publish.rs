//! NodePublishVolume and NodeUnpublishVolume: bind mounts of a stage into Pods' targets.

use std::path::PathBuf;

use csi_proto::v1::{
    NodePublishVolumeRequest, NodePublishVolumeResponse, NodeUnpublishVolumeRequest,
    NodeUnpublishVolumeResponse,
};
use mounter::{BindOptions, MountAttrs, Unmounted};

use super::stage::{describe, is_stage_of};
use super::{Owner, check_volume_id};
use crate::capability;
use crate::context::VolumeContext;
use crate::error::Error;

/// The mode of a target directory this driver creates.
const TARGET_MODE: u32 = 0o750;

impl Owner {
    /// NodePublishVolume: a bind of this process's live stage of the volume onto the target,
    /// read-only when asked or when the access mode is reader-only (set on the bind before it
    /// becomes visible). The same target with the same arguments again is OK.
    pub async fn publish(
        &self,
        req: &NodePublishVolumeRequest,
    ) -> Result<NodePublishVolumeResponse, Error> {
        check_volume_id(&req.volume_id)?;
        if req.target_path.is_empty() {
            return Err(Error::Missing {
                field: "target_path",
            });
        }
        if !req.secrets.is_empty() {
            return Err(Error::SecretsGiven);
        }
        let context = VolumeContext::parse(&req.volume_context, &self.config.credential_namespace)?;
        let access = capability::check(req.volume_capability.as_ref(), context.mode)?;
        if req.staging_target_path.is_empty() {
            return Err(Error::FailedPrecondition {
                volume_id: req.volume_id.clone(),
                problem: "staging_target_path is required: this driver stages every volume"
                    .to_owned(),
            });
        }
        let staging = PathBuf::from(&req.staging_target_path);
        self.resolve("staging_target_path", &staging)?;
        let target_path = PathBuf::from(&req.target_path);
        let target = self.resolve("target_path", &target_path)?;
        let _busy = self.begin(&req.volume_id)?;

        let Some(stage) = self.stage_at(&staging) else {
            return Err(Error::FailedPrecondition {
                volume_id: req.volume_id.clone(),
                problem: format!(
                    "{staging:?} holds no live stage of this volume made by this owner process"
                ),
            });
        };
        if stage.volume_id != req.volume_id || stage.context != context {
            return Err(Error::FailedPrecondition {
                volume_id: req.volume_id.clone(),
                problem: format!(
                    "{staging:?} holds the stage of volume {} at generation {}",
                    stage.volume_id, stage.context.generation
                ),
            });
        }
        if let Some(problem) = stage.unhealthy() {
            return Err(Error::FailedPrecondition {
                volume_id: req.volume_id.clone(),
                problem: format!("the stage cannot serve: {problem}"),
            });
        }
        let mounter_error = |source| Error::Mounter {
            volume_id: req.volume_id.clone(),
            source,
        };
        // The stage must still be this connection's mount, as the kernel sees it.
        let staged = self
            .mounter
            .mounted_at(&self.resolve("staging_target_path", &staging)?)
            .map_err(mounter_error)?;
        if staged.as_ref().map(|m| &m.identity) != Some(&stage.identity) {
            return Err(Error::FailedPrecondition {
                volume_id: req.volume_id.clone(),
                problem: format!("{staging:?} no longer holds the stage's mount"),
            });
        }

        let read_only = req.readonly || access.read_only();
        if let Some(found) = self.mounter.mounted_at(&target).map_err(mounter_error)? {
            if found.identity == stage.identity {
                if found.attrs.read_only == read_only {
                    return Ok(NodePublishVolumeResponse {});
                }
                return Err(Error::AlreadyExists {
                    path: target_path,
                    found: format!(
                        "a publication of this volume that is {}",
                        if found.attrs.read_only {
                            "read-only"
                        } else {
                            "read-write"
                        }
                    ),
                });
            }
            return Err(if is_stage_of(&found.identity, &req.volume_id) {
                Error::AlreadyExists {
                    path: target_path,
                    found: "a publication of another stage of this volume".to_owned(),
                }
            } else {
                Error::FailedPrecondition {
                    volume_id: req.volume_id.clone(),
                    problem: format!("{target_path:?} holds {}", describe(&found.identity)),
                }
            });
        }
        let created = target
            .create_dir(TARGET_MODE)
            .map_err(|source| Error::Path {
                field: "target_path",
                source,
            })?;
        let options = BindOptions {
            attrs: MountAttrs {
                read_only,
                nosuid: true,
                nodev: true,
                noexec: false,
            },
            ..BindOptions::default()
        };
        if let Err(source) = self.mounter.bind(&staging, &target, options) {
            if created {
                let _ = self.mounter.remove_target(&target);
            }
            return Err(Error::Mounter {
                volume_id: req.volume_id.clone(),
                source,
            });
        }
        metrics::gauge!("tak_os_node_publications").increment(1.0);
        Ok(NodePublishVolumeResponse {})
    }

    /// NodeUnpublishVolume: unmounts only a publication of this volume (filesystem type,
    /// source, the FUSE connection's device, root), decided from kernel metadata alone, then
    /// removes the empty target directory. An absent target is OK.
    pub async fn unpublish(
        &self,
        req: &NodeUnpublishVolumeRequest,
    ) -> Result<NodeUnpublishVolumeResponse, Error> {
        check_volume_id(&req.volume_id)?;
        if req.target_path.is_empty() {
            return Err(Error::Missing {
                field: "target_path",
            });
        }
        let target_path = PathBuf::from(&req.target_path);
        let target = self.resolve("target_path", &target_path)?;
        let _busy = self.begin(&req.volume_id)?;
        let mounter_error = |source| Error::Mounter {
            volume_id: req.volume_id.clone(),
            source,
        };
        if let Some(found) = self.mounter.mounted_at(&target).map_err(mounter_error)? {
            let ours = found.identity.fs_type == fusefs::FS_TYPE
                && found.identity.source == req.volume_id.as_str()
                && (self.stage_of(&req.volume_id).is_none_or(|s| {
                    (s.identity.major, s.identity.minor)
                        == (found.identity.major, found.identity.minor)
                }));
            if !ours {
                return Err(Error::FailedPrecondition {
                    volume_id: req.volume_id.clone(),
                    problem: format!(
                        "{target_path:?} holds {}, not a publication of this volume",
                        describe(&found.identity)
                    ),
                });
            }
            match self
                .mounter
                .unmount(&target, &found.identity)
                .map_err(mounter_error)?
            {
                Unmounted::Unmounted => {
                    metrics::gauge!("tak_os_node_publications").decrement(1.0);
                }
                Unmounted::NotMounted => {}
            }
        }
        self.mounter.remove_target(&target).map_err(mounter_error)?;
        Ok(NodeUnpublishVolumeResponse {})
    }
}
