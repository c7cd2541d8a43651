//! The worker's configuration: typed, with the DESIGN.md defaults, and shortened for tests by
//! [`Timings::scaled`] so that every proportion stays the same.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::tls::TlsMaterial;

/// Every duration the worker uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timings {
    /// Length of a mount lease (90 s).
    pub lease: Duration,
    /// How often clients renew their lease (20 s); the worker only reports it.
    pub renew_interval: Duration,
    /// Length of an open handle's lease (90 s).
    pub handle_lease: Duration,
    /// A client's budget for one logical call (15 s).
    pub call_budget: Duration,
    /// A client's budget for one HTTP attempt (3 s); also the worker's TLS handshake timeout.
    pub attempt_budget: Duration,
    /// How often a follower checks that it can reach the leader (1 s).
    pub probe_interval: Duration,
    /// How long a follower waits for the leader to accept a connection (1 s).
    pub probe_timeout: Duration,
    /// How often an idle apply loop reclaims expired handles (1 s).
    pub reclaim_interval: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(90),
            renew_interval: Duration::from_secs(20),
            handle_lease: Duration::from_secs(90),
            call_budget: Duration::from_secs(15),
            attempt_budget: Duration::from_secs(3),
            probe_interval: Duration::from_secs(1),
            probe_timeout: Duration::from_secs(1),
            reclaim_interval: Duration::from_secs(1),
        }
    }
}

impl Timings {
    /// Every duration multiplied by `factor` (0.01 makes a 900 ms lease renewed every 200 ms).
    pub fn scaled(&self, factor: f64) -> Self {
        let scale = |d: Duration| d.mul_f64(factor.max(0.0));
        Self {
            lease: scale(self.lease),
            renew_interval: scale(self.renew_interval),
            handle_lease: scale(self.handle_lease),
            call_budget: scale(self.call_budget),
            attempt_budget: scale(self.attempt_budget),
            probe_interval: scale(self.probe_interval),
            probe_timeout: scale(self.probe_timeout),
            reclaim_interval: scale(self.reclaim_interval),
        }
    }
}

/// How a volume may be attached; bound into its identity at creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessMode {
    /// One node mount session at a time, fenced by mount epochs.
    Rwo,
    /// Any number of nodes, no epochs.
    Rwx,
}

impl AccessMode {
    /// The wire protocol's value.
    pub fn to_wire(self) -> worker_proto::v1::AccessMode {
        match self {
            Self::Rwo => worker_proto::v1::AccessMode::Rwo,
            Self::Rwx => worker_proto::v1::AccessMode::Rwx,
        }
    }

    /// From the wire protocol's value; `None` for `UNSPECIFIED`.
    pub fn from_wire(mode: worker_proto::v1::AccessMode) -> Option<Self> {
        match mode {
            worker_proto::v1::AccessMode::Rwo => Some(Self::Rwo),
            worker_proto::v1::AccessMode::Rwx => Some(Self::Rwx),
            worker_proto::v1::AccessMode::Unspecified => None,
        }
    }
}

impl fmt::Display for AccessMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Rwo => "rwo",
            Self::Rwx => "rwx",
        })
    }
}

impl std::str::FromStr for AccessMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "rwo" => Ok(Self::Rwo),
            "rwx" => Ok(Self::Rwx),
            _ => Err(format!("unknown access mode {s:?} (rwo or rwx)")),
        }
    }
}

/// A volume's identity: what the manager fixes when it creates the volume.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct VolumeSpec {
    /// The volume ID (letters, digits, `.`, `_`, `-`).
    pub volume_id: String,
    /// The volume generation: the incarnation of this volume ID.
    pub volume_generation: u64,
    /// The access mode.
    pub access_mode: AccessMode,
}

impl fmt::Display for VolumeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}",
            self.volume_id, self.volume_generation, self.access_mode
        )
    }
}

impl std::str::FromStr for VolumeSpec {
    type Err = String;

    /// Parses `ID:GENERATION:MODE`, e.g. `pvc-1:1:rwo`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.rsplitn(3, ':');
        let (Some(mode), Some(generation), Some(volume_id)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("{s:?} is not ID:GENERATION:MODE"));
        };
        Ok(Self {
            volume_id: volume_id.to_owned(),
            volume_generation: generation
                .parse()
                .map_err(|_| format!("{generation:?} is not a volume generation"))?,
            access_mode: mode.parse()?,
        })
    }
}

/// How the worker opens a file again that it named earlier, knowing only its inode number.
///
/// Both ways give the same inode numbers and generations (derived from the filesystem's file
/// handle and journaled), so a reused inode number is refused (`ESTALE`) either way. They
/// differ in privilege, cost and what survives a restart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Reopen {
    /// By the filesystem's file handle (`open_by_handle_at(2)`), relative to the volume's data
    /// directory. Needs `CAP_DAC_READ_SEARCH` (in practice root) and holds nothing open per
    /// file; references survive a restart of the worker. What production uses.
    #[default]
    ByHandle,
    /// Through an `O_PATH` descriptor the worker keeps of every inode it names, reopened by way
    /// of `/proc/self/fd`. Needs no privilege, but holds one descriptor per named inode until
    /// the file's last link is removed through the worker (so the process's `RLIMIT_NOFILE`
    /// bounds how many files a volume can name), and a restarted worker has lost its
    /// references: a file ID from before the restart is `ESTALE` until the file is named again
    /// (looked up or listed), after which it opens with its old generation. For tests and
    /// unprivileged experiments, never production.
    ByDescriptor,
}

/// Whether this endpoint leads the group or follows a leader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Holds the volumes and applies every operation.
    Leader,
    /// Holds no state; answers NOT_LEADER naming `leader` (as `host:port`), or NO_QUORUM while
    /// the leader cannot be reached.
    Follower {
        /// The leader's endpoint, `host:port`.
        leader: String,
    },
}

/// Everything the worker needs to serve.
#[derive(Clone, Debug)]
pub struct Config {
    /// The address to listen on (port 0 picks one).
    pub listen: SocketAddr,
    /// The directory that holds every volume (leader only).
    pub state_dir: PathBuf,
    /// Server certificate, key and the CA that client certificates must chain to.
    pub tls: TlsMaterial,
    /// Leader or follower.
    pub role: Role,
    /// Durations.
    pub timings: Timings,
    /// How many replies each volume's reply cache may hold (131,072). Replies are kept for
    /// four call budgets and never dropped early: a faster stream of mutations than this many
    /// per retention is refused `BUSY` (logged once) until the oldest age out.
    pub dedup_capacity: usize,
    /// After how many journal records a volume writes a checkpoint (1024).
    pub compact_after: usize,
    /// How many requests may wait for one volume's apply loop (1024).
    pub queue_depth: usize,
    /// Volumes to create (or check) at startup.
    pub volumes: Vec<VolumeSpec>,
    /// How files are opened again by inode number ([`Reopen::ByHandle`]).
    pub reopen: Reopen,
}

impl Config {
    /// A leader on `listen` keeping its volumes in `state_dir`, with the default settings.
    pub fn new(listen: SocketAddr, state_dir: impl Into<PathBuf>, tls: TlsMaterial) -> Self {
        Self {
            listen,
            state_dir: state_dir.into(),
            tls,
            role: Role::Leader,
            timings: Timings::default(),
            dedup_capacity: 131_072,
            compact_after: 1024,
            queue_depth: 1024,
            volumes: Vec::new(),
            reopen: Reopen::ByHandle,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_keeps_proportions() {
        let t = Timings::default().scaled(0.01);
        assert_eq!(t.lease, Duration::from_millis(900));
        assert_eq!(t.renew_interval, Duration::from_millis(200));
        assert_eq!(t.call_budget, t.attempt_budget * 5);
    }

    #[test]
    fn volume_specs_parse() {
        let spec: VolumeSpec = "pvc-1:7:RWO".parse().unwrap();
        assert_eq!(spec.volume_id, "pvc-1");
        assert_eq!(spec.volume_generation, 7);
        assert_eq!(spec.access_mode, AccessMode::Rwo);
        assert_eq!(spec.to_string(), "pvc-1:7:rwo");
        assert!("pvc-1:x:rwo".parse::<VolumeSpec>().is_err());
        assert!("pvc-1:1:rw".parse::<VolumeSpec>().is_err());
        assert!("pvc-1".parse::<VolumeSpec>().is_err());
    }
}
