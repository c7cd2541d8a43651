//! NodeGetVolumeStats: bytes and inodes from the workers within a short bound, and the stage's
//! condition. Kubelet calls it often: it never waits longer than the bound.

use std::path::PathBuf;

use csi_proto::v1::volume_usage::Unit;
use csi_proto::v1::{
    NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse, VolumeCondition, VolumeUsage,
};

use super::{Owner, check_volume_id};
use crate::error::Error;

/// What the workers report of a volume's space.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VolumeStats {
    /// Total bytes.
    pub total_bytes: u64,
    /// Bytes available to an unprivileged writer.
    pub available_bytes: u64,
    /// Total inodes.
    pub total_inodes: u64,
    /// Free inodes.
    pub free_inodes: u64,
}

/// A stage's condition as NodeGetVolumeStats reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Condition {
    /// The stage serves.
    Normal,
    /// It does not, and why.
    Abnormal(String),
}

impl Owner {
    /// NodeGetVolumeStats for a stage or a publication of the volume at `volume_path`,
    /// decided from kernel metadata alone (NOT_FOUND when there is none).
    pub async fn volume_stats(
        &self,
        req: &NodeGetVolumeStatsRequest,
    ) -> Result<NodeGetVolumeStatsResponse, Error> {
        check_volume_id(&req.volume_id)?;
        if req.volume_path.is_empty() {
            return Err(Error::Missing {
                field: "volume_path",
            });
        }
        let path = PathBuf::from(&req.volume_path);
        let target = self.resolve("volume_path", &path)?;
        let not_found = || Error::NotFound {
            volume_id: req.volume_id.clone(),
            path: path.clone(),
        };
        let found = self
            .mounter
            .mounted_at(&target)
            .map_err(|source| Error::Mounter {
                volume_id: req.volume_id.clone(),
                source,
            })?
            .ok_or_else(not_found)?;
        if found.identity.fs_type != fusefs::FS_TYPE
            || found.identity.source != req.volume_id.as_str()
        {
            return Err(not_found());
        }
        let stage = self.stage_of(&req.volume_id).filter(|stage| {
            (stage.identity.major, stage.identity.minor)
                == (found.identity.major, found.identity.minor)
        });
        let Some(stage) = stage else {
            return Ok(abnormal(
                "the FUSE connection of this mount is not held by this owner process (it was made by an earlier one): unpublish and unstage to recover",
            ));
        };
        if let Some(problem) = stage.unhealthy() {
            return Ok(abnormal(&format!("the stage cannot serve: {problem}")));
        }
        let fs = {
            let mounted = stage.mounted.lock().await;
            match mounted.as_ref() {
                Some(mounted) => std::sync::Arc::clone(mounted.fs()),
                None => return Ok(abnormal("the stage is being unmounted")),
            }
        };
        let stats = match tokio::time::timeout(self.config.stats_timeout, fs.volume_statfs()).await
        {
            Ok(Ok(stats)) => stats,
            Ok(Err(e)) => {
                return Ok(abnormal(&format!(
                    "the workers did not answer: {}",
                    error_text::chain(&e)
                )));
            }
            Err(_) => {
                return Ok(abnormal(&format!(
                    "the workers did not answer within {:?}",
                    self.config.stats_timeout
                )));
            }
        };
        let block = u64::from(stats.block_size.max(1));
        let usage = VolumeStats {
            total_bytes: stats.blocks.saturating_mul(block),
            available_bytes: stats.blocks_available.saturating_mul(block),
            total_inodes: stats.files,
            free_inodes: stats.files_free,
        };
        Ok(response(usage, Condition::Normal))
    }
}

fn abnormal(message: &str) -> NodeGetVolumeStatsResponse {
    response(
        VolumeStats::default(),
        Condition::Abnormal(message.to_owned()),
    )
}

fn response(stats: VolumeStats, condition: Condition) -> NodeGetVolumeStatsResponse {
    let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let usage = if stats == VolumeStats::default() {
        Vec::new()
    } else {
        vec![
            VolumeUsage {
                available: clamp(stats.available_bytes),
                total: clamp(stats.total_bytes),
                used: clamp(stats.total_bytes.saturating_sub(stats.available_bytes)),
                unit: Unit::Bytes as i32,
            },
            VolumeUsage {
                available: clamp(stats.free_inodes),
                total: clamp(stats.total_inodes),
                used: clamp(stats.total_inodes.saturating_sub(stats.free_inodes)),
                unit: Unit::Inodes as i32,
            },
        ]
    };
    let (abnormal, message) = match condition {
        Condition::Normal => (false, "the stage serves".to_owned()),
        Condition::Abnormal(message) => (true, message),
    };
    NodeGetVolumeStatsResponse {
        usage,
        volume_condition: Some(VolumeCondition { abnormal, message }),
    }
}
