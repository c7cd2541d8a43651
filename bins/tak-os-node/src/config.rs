//! Flags (each also readable from an environment variable) and the typed configuration built
//! from them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use csi_proto::UnixEndpoint;

use crate::DRIVER_NAME;
use crate::owner::OwnerConfig;

/// The replicated node's mount owner for `fuse.tak-os-replicated` volumes.
#[derive(Debug, Parser)]
#[command(name = "tak-os-node", version, about, long_about = None)]
pub struct Cli {
    /// The CSI endpoint to serve Identity and Node on, as unix:///path.
    #[arg(long, env = "CSI_ENDPOINT", default_value = "unix:///csi/csi.sock")]
    pub csi_endpoint: String,

    /// Frontend mode: serve kubelet on --csi-endpoint and forward every Node call to the mount
    /// owner on this socket (unix:///path). Without it, this process is the mount owner.
    #[arg(long, env = "TAK_OS_MOUNT_SERVICE")]
    pub mount_service: Option<String>,

    /// This node's Kubernetes name (its CSI node ID).
    #[arg(long, env = "NODE_NAME")]
    pub node_id: Option<String>,

    /// The CSI driver name to answer GetPluginInfo with.
    #[arg(long, env = "TAK_OS_DRIVER_NAME", default_value = DRIVER_NAME)]
    pub driver_name: String,

    /// Kubelet's root directory: staging and target paths must lie below it.
    #[arg(long, env = "TAK_OS_KUBELET_ROOT", default_value = "/var/lib/kubelet")]
    pub kubelet_root: PathBuf,

    /// The namespace of the volumes' credential Secrets (`<volumeID>-auth`); the only one
    /// credentials are read from.
    #[arg(
        long,
        env = "TAK_OS_CREDENTIAL_NAMESPACE",
        default_value = "tak-os-system"
    )]
    pub credential_namespace: String,

    /// Read credentials from `<dir>/<volumeID>/` instead of Kubernetes Secrets (development
    /// and the demo).
    #[arg(long, env = "TAK_OS_CREDENTIALS_DIR")]
    pub credentials_dir: Option<PathBuf>,

    /// Address of the HTTP server for /metrics and /healthz; empty disables it.
    #[arg(long, env = "TAK_OS_METRICS_ADDRESS", default_value = "0.0.0.0:9899")]
    pub metrics_address: String,

    /// How long an RWO lease lasts after each renewal, in seconds.
    #[arg(long, env = "TAK_OS_LEASE_SECONDS", default_value_t = 90.0)]
    pub lease_seconds: f64,

    /// How often an RWO lease is renewed, in seconds.
    #[arg(long, env = "TAK_OS_LEASE_RENEW_SECONDS", default_value_t = 20.0)]
    pub lease_renew_seconds: f64,

    /// How long one worker call may take, retries included, in seconds.
    #[arg(long, env = "TAK_OS_CALL_BUDGET_SECONDS", default_value_t = 15.0)]
    pub call_budget_seconds: f64,

    /// Keeper mode: hold copies of the mount owner's FUSE connections on --keeper-socket, so
    /// that mounts survive an owner upgrade. Nothing else runs in this mode.
    #[arg(long, env = "TAK_OS_KEEPER")]
    pub keeper: bool,

    /// The keeper's socket (a path). The owner deposits every stage there and hands them over
    /// when told to stop; without it, an owner restart ends every mount. In keeper mode, where
    /// to listen.
    #[arg(long, env = "TAK_OS_KEEPER_SOCKET")]
    pub keeper_socket: Option<PathBuf>,

    /// Keeper mode: end the connections of an owner that dies without handing them over at
    /// once, as on kernels without FUSE_NOTIFY_RESEND (before Linux 6.9), instead of keeping
    /// them for a successor to take over.
    #[arg(long, env = "TAK_OS_KEEPER_NO_RESEND")]
    pub no_resend: bool,

    /// How long an owner told to stop waits for the requests in flight on its FUSE
    /// connections before handing them to the keeper, in seconds.
    #[arg(long, env = "TAK_OS_HANDOFF_DEADLINE_SECONDS", default_value_t = 10.0)]
    pub handoff_deadline_seconds: f64,

    /// How many threads serve the FUSE mounts; 0 means one per CPU the process may use. Each
    /// mount is served by one of them, its worker connections with it.
    #[arg(long, env = "TAK_OS_SERVING_THREADS", default_value_t = 0)]
    pub serving_threads: usize,

    /// Log format.
    #[arg(long, env = "TAK_OS_LOG_FORMAT", value_enum, default_value_t = LogFormat::Json)]
    pub log_format: LogFormat,
}

/// The most threads `--serving-threads` may ask for: more than any node has CPUs.
const MAX_SERVING_THREADS: usize = 1024;

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

/// Where credentials come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// Kubernetes Secrets in the credential namespace.
    Kubernetes,
    /// Files below this directory.
    Directory(PathBuf),
}

/// The validated configuration of any mode: the owner (the default), the frontend
/// (`mount_service`) or the keeper (`keeper`).
#[derive(Debug, Clone)]
pub struct Config {
    /// Keeper mode: listen on `owner.keeper_socket`, nothing else.
    pub keeper: bool,
    /// Keeper mode: end a dead owner's connections at once, never keep them for a successor.
    pub no_resend: bool,
    /// Where to serve CSI.
    pub endpoint: UnixEndpoint,
    /// In frontend mode, the mount owner's socket.
    pub mount_service: Option<UnixEndpoint>,
    /// The CSI driver name.
    pub driver_name: String,
    /// Where credentials come from.
    pub credentials: Credentials,
    /// The metrics server address, when on.
    pub metrics_address: Option<SocketAddr>,
    /// What the owner itself needs.
    pub owner: OwnerConfig,
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

fn seconds(flag: &'static str, value: f64) -> Result<Duration, ConfigError> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| bad(flag, format!("{value} is not a positive number of seconds")))
}

impl Cli {
    /// Validates the flags.
    pub fn config(&self) -> Result<Config, ConfigError> {
        let endpoint = UnixEndpoint::parse(&self.csi_endpoint)
            .map_err(|e| bad("--csi-endpoint", e.to_string()))?;
        let mount_service = self
            .mount_service
            .as_deref()
            .map(|service| {
                UnixEndpoint::parse(service).map_err(|e| bad("--mount-service", e.to_string()))
            })
            .transpose()?;
        if let Some(service) = &mount_service
            && service.path() == endpoint.path()
        {
            return Err(bad(
                "--mount-service",
                "must not be the socket this process serves (--csi-endpoint)",
            ));
        }
        let keeper_socket = match &self.keeper_socket {
            Some(path) if path.is_absolute() && path.file_name().is_some() => Some(path.clone()),
            Some(path) => {
                return Err(bad(
                    "--keeper-socket",
                    format!("{path:?} is not an absolute path of a file"),
                ));
            }
            None => None,
        };
        if self.no_resend && !self.keeper {
            return Err(bad("--no-resend", "is a keeper option (--keeper)"));
        }
        if self.keeper {
            if keeper_socket.is_none() {
                return Err(bad("--keeper", "needs --keeper-socket"));
            }
            if mount_service.is_some() {
                return Err(bad("--keeper", "cannot be combined with --mount-service"));
            }
        }
        let node_id = match &self.node_id {
            Some(node) if !node.is_empty() => node.clone(),
            // The keeper knows no node: it holds whatever the owner deposits.
            _ if self.keeper => String::new(),
            _ => return Err(bad("--node-id", "is required (or set NODE_NAME)")),
        };
        if self.driver_name.is_empty() {
            return Err(bad("--driver-name", "must not be empty"));
        }
        if !self.kubelet_root.is_absolute() {
            return Err(bad(
                "--kubelet-root",
                format!("{:?} is not absolute", self.kubelet_root),
            ));
        }
        if self.credential_namespace.is_empty() {
            return Err(bad("--credential-namespace", "must not be empty"));
        }
        let credentials = match &self.credentials_dir {
            Some(dir) if dir.is_absolute() => Credentials::Directory(dir.clone()),
            Some(dir) => {
                return Err(bad("--credentials-dir", format!("{dir:?} is not absolute")));
            }
            None => Credentials::Kubernetes,
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
        let lease_duration = seconds("--lease-seconds", self.lease_seconds)?;
        let renew_interval = seconds("--lease-renew-seconds", self.lease_renew_seconds)?;
        let call = seconds("--call-budget-seconds", self.call_budget_seconds)?;
        let handoff_deadline =
            seconds("--handoff-deadline-seconds", self.handoff_deadline_seconds)?;
        if self.serving_threads > MAX_SERVING_THREADS {
            return Err(bad(
                "--serving-threads",
                format!(
                    "{} is more than {MAX_SERVING_THREADS}",
                    self.serving_threads
                ),
            ));
        }
        if renew_interval >= lease_duration {
            return Err(bad(
                "--lease-renew-seconds",
                "must be shorter than --lease-seconds",
            ));
        }
        // The protocol's proportions, scaled to the call budget asked for.
        let budgets = lease_client::Budgets::default();
        let budgets = budgets.scaled(call.as_secs_f64() / budgets.call.as_secs_f64());
        let lease = lease_client::LeaseConfig {
            lease: lease_duration,
            renew_interval,
            ..lease_client::LeaseConfig::default()
        };
        let mut owner = OwnerConfig::new(node_id);
        owner.kubelet_root = self.kubelet_root.clone();
        owner.credential_namespace = self.credential_namespace.clone();
        owner.budgets = budgets;
        owner.lease = lease;
        owner.keeper_socket = keeper_socket;
        owner.handoff_deadline = handoff_deadline;
        owner.serving_threads = self.serving_threads;
        Ok(Config {
            keeper: self.keeper,
            no_resend: self.no_resend,
            endpoint,
            mount_service,
            driver_name: self.driver_name.clone(),
            credentials,
            metrics_address,
            owner,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn cli(args: &[&str]) -> Result<Config, ConfigError> {
        let mut all = vec!["tak-os-node", "--node-id", "node-a"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all).unwrap().config()
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let config = cli(&[]).unwrap();
        assert_eq!(config.endpoint.path(), Path::new("/csi/csi.sock"));
        assert_eq!(config.driver_name, "csi.replicated.tak-os.org");
        assert_eq!(config.credentials, Credentials::Kubernetes);
        assert_eq!(config.owner.kubelet_root, Path::new("/var/lib/kubelet"));
        assert_eq!(config.owner.credential_namespace, "tak-os-system");
        assert_eq!(config.owner.lease.lease, Duration::from_secs(90));
        assert_eq!(config.owner.lease.renew_interval, Duration::from_secs(20));
        assert_eq!(config.owner.budgets.call, Duration::from_secs(15));
        assert_eq!(
            config.metrics_address,
            Some("0.0.0.0:9899".parse().unwrap())
        );
        assert!(config.mount_service.is_none(), "the owner is the default");
        assert!(!config.keeper);
        assert_eq!(config.owner.keeper_socket, None, "no keeper unless asked");
        assert_eq!(config.owner.handoff_deadline, Duration::from_secs(10));
        assert_eq!(config.owner.serving_threads, 0, "one per CPU");
        assert_eq!(
            cli(&["--serving-threads", "3"])
                .unwrap()
                .owner
                .serving_threads,
            3
        );
        let keeper =
            Cli::try_parse_from(["tak-os-node", "--keeper", "--keeper-socket", "/run/k.sock"])
                .unwrap()
                .config()
                .unwrap();
        assert!(keeper.keeper, "the keeper needs no node ID");
        assert_eq!(
            keeper.owner.keeper_socket.as_deref(),
            Some(Path::new("/run/k.sock"))
        );
        let frontend = cli(&["--mount-service", "unix:///run/tak-os/owner.sock"]).unwrap();
        assert_eq!(
            frontend.mount_service.unwrap().path(),
            Path::new("/run/tak-os/owner.sock")
        );
    }

    #[test]
    fn bad_flags_name_the_flag() {
        for (args, flag) in [
            (&["--csi-endpoint", "tcp://x:1"][..], "--csi-endpoint"),
            (&["--kubelet-root", "relative"], "--kubelet-root"),
            (&["--credentials-dir", "relative"], "--credentials-dir"),
            (&["--metrics-address", "nowhere"], "--metrics-address"),
            (&["--lease-seconds", "0"], "--lease-seconds"),
            (
                &["--lease-seconds", "10", "--lease-renew-seconds", "10"],
                "--lease-renew-seconds",
            ),
            (&["--call-budget-seconds=-1"], "--call-budget-seconds"),
            (&["--credential-namespace", ""], "--credential-namespace"),
            (&["--mount-service", "/no/scheme"], "--mount-service"),
            (
                &["--mount-service", "unix:///csi/csi.sock"],
                "--mount-service",
            ),
            (&["--keeper-socket", "relative.sock"], "--keeper-socket"),
            (&["--keeper"], "--keeper"),
            (
                &[
                    "--keeper",
                    "--keeper-socket=/k.sock",
                    "--mount-service=unix:///o.sock",
                ],
                "--keeper",
            ),
            (
                &["--handoff-deadline-seconds", "0"],
                "--handoff-deadline-seconds",
            ),
            (&["--serving-threads", "1025"], "--serving-threads"),
        ] {
            let error = cli(args).unwrap_err();
            assert!(error.to_string().starts_with(flag), "{args:?}: {error}");
        }
        let error = Cli::try_parse_from(["tak-os-node"])
            .unwrap()
            .config()
            .unwrap_err();
        assert!(error.to_string().starts_with("--node-id"), "{error}");
    }
}
