//! Flags (each also readable from an environment variable) and the typed configuration built
//! from them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand, ValueEnum};
use csi_proto::UnixEndpoint;
use mounter::TargetRoot;

/// The node-local CSI driver `csi.local.tak-os.org`.
#[derive(Debug, Parser)]
#[command(name = "tak-os-local-csi", version, about, long_about = None)]
pub struct Cli {
    /// What to do; without a subcommand the driver serves CSI.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// The CSI endpoint to serve, as unix:///path.
    #[arg(long, env = "CSI_ENDPOINT", default_value = "unix:///csi/csi.sock")]
    pub endpoint: String,

    /// This node's Kubernetes name (its CSI node ID).
    #[arg(long, env = "NODE_NAME", global = true)]
    pub node_id: Option<String>,

    /// The volume store: a root-owned directory, ideally the root of its own filesystem.
    #[arg(
        long,
        env = "TAK_OS_VOLUME_PATH",
        default_value = "/var/lib/tak-os/local-volumes",
        global = true
    )]
    pub volume_path: PathBuf,

    /// Kubelet's root directory: publication targets must lie below it.
    #[arg(long, env = "TAK_OS_KUBELET_ROOT", default_value = "/var/lib/kubelet")]
    pub kubelet_root: PathBuf,

    /// Enables the trusted consumer extension with targets `<root>/<generation>/<replica>/mount`.
    #[arg(long, env = "TAK_OS_CONSUMER_MOUNT_ROOT")]
    pub consumer_mount_root: Option<PathBuf>,

    /// Address of the HTTP server for /metrics and /healthz; empty disables it.
    #[arg(long, env = "TAK_OS_METRICS_ADDRESS", default_value = "0.0.0.0:9898")]
    pub metrics_address: String,

    /// Refuse to start unless the store is the root of its own filesystem (a mounted disk).
    #[arg(long, env = "TAK_OS_REQUIRE_MOUNTED_STORE")]
    pub require_mounted_store: bool,

    /// Bytes of the store's filesystem never offered to volumes.
    #[arg(long, env = "TAK_OS_RESERVE_BYTES", default_value_t = 0)]
    pub reserve_bytes: u64,

    /// The maximum number of volumes published on this node that is reported to kubelet; 0
    /// means no limit.
    #[arg(long, env = "TAK_OS_MAX_VOLUMES_PER_NODE", default_value_t = 0)]
    pub max_volumes_per_node: i64,

    /// Log format.
    #[arg(long, env = "TAK_OS_LOG_FORMAT", value_enum, default_value_t = LogFormat::Json, global = true)]
    pub log_format: LogFormat,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Prints the store's volumes, states, orphans and claims without changing anything.
    Audit {
        /// Output format.
        #[arg(long, value_enum, default_value_t = AuditFormat::Table)]
        format: AuditFormat,
    },
}

/// Log formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable lines.
    Text,
}

impl From<LogFormat> for observe::LogFormat {
    fn from(format: LogFormat) -> Self {
        match format {
            LogFormat::Json => observe::LogFormat::Json,
            LogFormat::Text => observe::LogFormat::Text,
        }
    }
}

/// Audit output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AuditFormat {
    /// An aligned table.
    Table,
    /// One JSON document.
    Json,
}

/// The driver's validated configuration.
#[derive(Debug)]
pub struct Config {
    /// Where to serve CSI.
    pub endpoint: UnixEndpoint,
    /// The node name.
    pub node_id: String,
    /// The store root.
    pub volume_path: PathBuf,
    /// Kubelet's root.
    pub kubelet_root: TargetRoot,
    /// The trusted consumer root, when the extension is on.
    pub consumer_root: Option<TargetRoot>,
    /// The metrics server address, when on.
    pub metrics_address: Option<SocketAddr>,
    /// Whether the store must be its own filesystem.
    pub require_mounted_store: bool,
    /// Reserved bytes.
    pub reserve_bytes: u64,
    /// Reported volume limit.
    pub max_volumes_per_node: i64,
}

/// Why a configuration is unusable.
#[derive(Debug, thiserror::Error)]
#[error("{flag}: {problem}")]
pub struct ConfigError {
    flag: &'static str,
    problem: String,
}

fn bad(flag: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        flag,
        problem: problem.into(),
    }
}

impl Cli {
    /// The node name, required by every mode.
    pub fn node_name(&self) -> Result<String, ConfigError> {
        match &self.node_id {
            Some(node) if !node.is_empty() => Ok(node.clone()),
            _ => Err(bad("--node-id", "is required (or set NODE_NAME)")),
        }
    }

    /// Validates the flags for serving.
    pub fn config(&self) -> Result<Config, ConfigError> {
        let endpoint =
            UnixEndpoint::parse(&self.endpoint).map_err(|e| bad("--endpoint", e.to_string()))?;
        let node_id = self.node_name()?;
        if !self.volume_path.is_absolute() {
            return Err(bad(
                "--volume-path",
                format!("{:?} is not absolute", self.volume_path),
            ));
        }
        let kubelet_root = TargetRoot::new(&self.kubelet_root)
            .map_err(|e| bad("--kubelet-root", e.to_string()))?;
        let consumer_root = match &self.consumer_mount_root {
            None => None,
            Some(root) => {
                let root = TargetRoot::new(root)
                    .map_err(|e| bad("--consumer-mount-root", e.to_string()))?;
                for (name, other) in [
                    ("the store", &self.volume_path),
                    ("the kubelet root", &self.kubelet_root),
                ] {
                    if overlaps(root.path(), other) {
                        return Err(bad(
                            "--consumer-mount-root",
                            format!(
                                "{:?} overlaps {name} {other:?}; it must contain neither and lie in neither",
                                root.path()
                            ),
                        ));
                    }
                }
                Some(root)
            }
        };
        let metrics_address = if self.metrics_address.is_empty() {
            None
        } else {
            Some(self.metrics_address.parse().map_err(|e| {
                bad(
                    "--metrics-address",
                    format!("{:?} is not host:port: {e}", self.metrics_address),
                )
            })?)
        };
        if self.max_volumes_per_node < 0 {
            return Err(bad("--max-volumes-per-node", "must not be negative"));
        }
        Ok(Config {
            endpoint,
            node_id,
            volume_path: self.volume_path.clone(),
            kubelet_root,
            consumer_root,
            metrics_address,
            require_mounted_store: self.require_mounted_store,
            reserve_bytes: self.reserve_bytes,
            max_volumes_per_node: self.max_volumes_per_node,
        })
    }
}

/// Whether one path contains the other (or they are equal), by whole components.
fn overlaps(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Cli {
        let mut all = vec!["tak-os-local-csi", "--node-id", "node-a"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all).unwrap()
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let config = cli(&[]).config().unwrap();
        assert_eq!(config.endpoint.path(), Path::new("/csi/csi.sock"));
        assert_eq!(
            config.volume_path,
            Path::new("/var/lib/tak-os/local-volumes")
        );
        assert_eq!(config.kubelet_root.path(), Path::new("/var/lib/kubelet"));
        assert_eq!(
            config.metrics_address,
            Some("0.0.0.0:9898".parse().unwrap())
        );
        assert!(config.consumer_root.is_none());
    }

    #[test]
    fn a_consumer_root_must_not_overlap_the_store_or_kubelet() {
        for root in [
            "/var/lib/kubelet/consumers",
            "/var/lib",
            "/var/lib/tak-os/local-volumes/c",
            "/",
        ] {
            let err = cli(&["--consumer-mount-root", root]).config().unwrap_err();
            assert!(
                err.to_string().starts_with("--consumer-mount-root"),
                "{root}: {err}"
            );
        }
        let ok = cli(&["--consumer-mount-root", "/var/lib/tak-os/consumers"])
            .config()
            .unwrap();
        assert!(ok.consumer_root.is_some());
        assert!(cli(&["--consumer-mount-root", "/a/../b"]).config().is_err());
    }

    #[test]
    fn bad_flags_name_the_flag() {
        let err = cli(&["--endpoint", "tcp://0:1"]).config().unwrap_err();
        assert!(err.to_string().starts_with("--endpoint"), "{err}");
        let err = Cli::try_parse_from(["x"]).unwrap().config().unwrap_err();
        assert!(err.to_string().starts_with("--node-id"), "{err}");
        let err = cli(&["--metrics-address", "nope"]).config().unwrap_err();
        assert!(err.to_string().starts_with("--metrics-address"), "{err}");
    }
}
