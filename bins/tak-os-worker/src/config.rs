//! Command-line flags (each also read from an environment variable) and the typed config.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use csi_proto::UnixEndpoint;
use worker::{Role, Timings, TlsMaterial, VolumeSpec};

use crate::controller::{ControllerSettings, CredentialFiles, DEFAULT_DRIVER_NAME};

const LONG_ABOUT: &str = "\
The TAK-OS reference worker: serves volumes kept in a backing directory over HTTPS, as the
worker side of the TAK-OS wire protocol. A leader holds the volumes and applies every operation
in one order; followers (--follow) hold nothing and point clients at the leader.

Every call needs a client certificate that chains to --client-ca and an
`Authorization: Bearer <token>` header with a token from --token-file (one token per line;
the file is re-read when it changes, so a rotation lists the old and new token, then the new
one only). Admin calls use the same authentication:
  POST /takos.worker.v1/admin/volumes  {\"volume_id\":\"pvc-1\",\"volume_generation\":1,\"access_mode\":\"rwo\"}
  POST /takos.worker.v1/admin/faults   {\"drop_replies\":1} | {\"delay_ms\":500} | {\"hang\":true}
                                       | {\"minority\":true} | {\"restart\":true}

Opening files by handle needs CAP_DAC_READ_SEARCH (run as root) and a state directory on a
filesystem with file handles (ext4, xfs, btrfs, tmpfs).

RUNNING ON LOOPBACK

Make a CA, a server certificate for 127.0.0.1/localhost and a client certificate
(OpenSSL 3):

  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \\
    -subj /CN=tak-os-test-ca -keyout ca.key -out ca.pem \\
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \\
    -subj /CN=localhost -CA ca.pem -CAkey ca.key -keyout server.key -out server.pem \\
    -addext subjectAltName=DNS:localhost,IP:127.0.0.1 -addext extendedKeyUsage=serverAuth \\
    -addext basicConstraints=CA:FALSE
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \\
    -subj /CN=tak-os-node -CA ca.pem -CAkey ca.key -keyout client.key -out client.pem \\
    -addext extendedKeyUsage=clientAuth -addext basicConstraints=CA:FALSE
  openssl rand -hex 32 > token

Start a leader with one RWO volume, and a follower beside it:

  tak-os-worker --listen 127.0.0.1:7443 --state-dir ./state --cert server.pem \\
    --key server.key --client-ca ca.pem --token-file token --volume pvc-1:1:rwo
  tak-os-worker --listen 127.0.0.1:7444 --follow 127.0.0.1:7443 --cert server.pem \\
    --key server.key --client-ca ca.pem --token-file token

Create another volume as the manager would:

  curl --cacert ca.pem --cert client.pem --key client.key \\
    -H \"Authorization: Bearer $(cat token)\" \\
    -d '{\"volume_id\":\"pvc-2\",\"volume_generation\":1,\"access_mode\":\"rwx\"}' \\
    https://127.0.0.1:7443/takos.worker.v1/admin/volumes

Delete one (its state and data are removed; deleting an absent volume is not an error):

  curl ... -d '{\"volume_id\":\"pvc-2\"}' https://127.0.0.1:7443/takos.worker.v1/admin/volumes/delete

THE REFERENCE CSI CONTROLLER

With --csi-endpoint, a leader also serves CSI Identity and Controller on a Unix socket, so that
CSI tooling can create and delete volumes for the replicated node (csi.replicated.tak-os.org):

  tak-os-worker ... --csi-endpoint unix:///run/tak-os-worker/csi.sock \\
    --group-endpoint https://127.0.0.1:7443,https://127.0.0.1:7444

CreateVolume takes the StorageClass parameter accessMode (rwx or rwo, default rwx) and answers
with the node's volume context. For development, --credentials-dir DIR with --credentials-ca,
--credentials-cert and --credentials-key writes each volume's credentials where the node's
--credentials-dir reads them. It is a reference for tests and demos, not the product's manager.

Durations take a unit (500ms, 3s, 2m); --time-scale multiplies all of them (0.01 turns the
90 s lease into 900 ms and keeps every proportion).";

/// The log format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl From<LogFormat> for observe::LogFormat {
    fn from(format: LogFormat) -> Self {
        match format {
            LogFormat::Json => observe::LogFormat::Json,
            LogFormat::Text => observe::LogFormat::Text,
        }
    }
}

/// Parses `500ms`, `3s`, `2m` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 500ms, 3s or 2m"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        _ => return Err(format!("unknown unit {unit:?} in {text:?} (ms, s or m)")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

/// The flags of `tak-os-worker`.
#[derive(Debug, Parser)]
#[command(name = "tak-os-worker", version, about = "The TAK-OS reference worker", long_about = LONG_ABOUT)]
pub struct Cli {
    /// Address to listen on.
    #[arg(long, env = "TAK_OS_WORKER_LISTEN", default_value = "127.0.0.1:7443")]
    pub listen: SocketAddr,
    /// Directory holding the volumes (leader only; created if missing).
    #[arg(
        long,
        env = "TAK_OS_WORKER_STATE_DIR",
        required_unless_present = "follow"
    )]
    pub state_dir: Option<PathBuf>,
    /// Server certificate chain (PEM).
    #[arg(long, env = "TAK_OS_WORKER_CERT")]
    pub cert: PathBuf,
    /// Server private key (PEM).
    #[arg(long, env = "TAK_OS_WORKER_KEY")]
    pub key: PathBuf,
    /// CA bundle that client certificates must chain to (PEM).
    #[arg(long, env = "TAK_OS_WORKER_CLIENT_CA")]
    pub client_ca: PathBuf,
    /// File with the accepted bearer tokens, one per line; re-read when it changes.
    #[arg(long, env = "TAK_OS_WORKER_TOKEN_FILE")]
    pub token_file: PathBuf,
    /// Follow the leader at this `host:port` instead of leading.
    #[arg(long, env = "TAK_OS_WORKER_FOLLOW")]
    pub follow: Option<String>,
    /// A volume to create or check at startup, as ID:GENERATION:MODE (mode rwo or rwx).
    #[arg(long = "volume", env = "TAK_OS_WORKER_VOLUMES", value_delimiter = ',')]
    pub volumes: Vec<VolumeSpec>,
    /// Mount lease length.
    #[arg(long, env = "TAK_OS_WORKER_LEASE", default_value = "90s", value_parser = parse_duration)]
    pub lease: Duration,
    /// Lease renewal interval clients are expected to use.
    #[arg(long, env = "TAK_OS_WORKER_RENEW_INTERVAL", default_value = "20s", value_parser = parse_duration)]
    pub renew_interval: Duration,
    /// Open handle lease length.
    #[arg(long, env = "TAK_OS_WORKER_HANDLE_LEASE", default_value = "90s", value_parser = parse_duration)]
    pub handle_lease: Duration,
    /// Budget of one logical call (clients' setting, reported for reference).
    #[arg(long, env = "TAK_OS_WORKER_CALL_BUDGET", default_value = "15s", value_parser = parse_duration)]
    pub call_budget: Duration,
    /// Budget of one attempt; also the TLS handshake timeout.
    #[arg(long, env = "TAK_OS_WORKER_ATTEMPT_BUDGET", default_value = "3s", value_parser = parse_duration)]
    pub attempt_budget: Duration,
    /// How often a follower probes the leader.
    #[arg(long, env = "TAK_OS_WORKER_PROBE_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub probe_interval: Duration,
    /// Multiply every duration by this factor (for tests and demos).
    #[arg(long, env = "TAK_OS_WORKER_TIME_SCALE", default_value_t = 1.0)]
    pub time_scale: f64,
    /// Most replies kept per volume for request-ID deduplication (each is kept for twice the
    /// call budget unless more mutations than this arrive within that time).
    #[arg(long, env = "TAK_OS_WORKER_DEDUP_CAPACITY", default_value_t = 131_072)]
    pub dedup_capacity: usize,
    /// Journal records after which a volume writes a checkpoint.
    #[arg(long, env = "TAK_OS_WORKER_COMPACT_AFTER", default_value_t = 1024)]
    pub compact_after: usize,
    /// Log format.
    #[arg(
        long,
        env = "TAK_OS_WORKER_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,

    /// Also serve the reference CSI controller (Identity and Controller) on this Unix socket,
    /// unix:///path (a leader only).
    #[arg(long, env = "TAK_OS_WORKER_CSI_ENDPOINT", requires = "group_endpoints")]
    pub csi_endpoint: Option<String>,
    /// The driver name the controller answers GetPluginInfo with.
    #[arg(long, env = "TAK_OS_WORKER_DRIVER_NAME", default_value = DEFAULT_DRIVER_NAME)]
    pub driver_name: String,
    /// A worker endpoint of the whole group, https://host:port, as volume contexts list them
    /// (repeat the flag or separate with commas; the leader's own endpoint included).
    #[arg(
        long = "group-endpoint",
        env = "TAK_OS_WORKER_GROUP_ENDPOINTS",
        value_delimiter = ','
    )]
    pub group_endpoints: Vec<String>,
    /// The namespace of the volumes' credential Secrets, put in every volume context.
    #[arg(long, env = "TAK_OS_WORKER_CREDENTIAL_NAMESPACE")]
    pub credential_namespace: Option<String>,
    /// Development only: write each created volume's credentials to `DIR/<volume-id>/` (the
    /// node's --credentials-dir), from --credentials-ca, --credentials-cert, --credentials-key
    /// and the first token of --token-file.
    #[arg(
        long,
        env = "TAK_OS_WORKER_CREDENTIALS_DIR",
        requires_all = ["credentials_ca", "credentials_cert", "credentials_key"]
    )]
    pub credentials_dir: Option<PathBuf>,
    /// The CA bundle nodes verify the workers with (for --credentials-dir).
    #[arg(
        long,
        env = "TAK_OS_WORKER_CREDENTIALS_CA",
        requires = "credentials_dir"
    )]
    pub credentials_ca: Option<PathBuf>,
    /// The client certificate handed to nodes (for --credentials-dir).
    #[arg(
        long,
        env = "TAK_OS_WORKER_CREDENTIALS_CERT",
        requires = "credentials_dir"
    )]
    pub credentials_cert: Option<PathBuf>,
    /// The client certificate's key handed to nodes (for --credentials-dir).
    #[arg(
        long,
        env = "TAK_OS_WORKER_CREDENTIALS_KEY",
        requires = "credentials_dir"
    )]
    pub credentials_key: Option<PathBuf>,
}

/// What `main` hands to [`crate::run`].
#[derive(Debug)]
pub struct Settings {
    /// The worker library's configuration.
    pub worker: worker::Config,
    /// The token file to watch.
    pub token_file: PathBuf,
    /// The reference CSI controller, when --csi-endpoint is set.
    pub controller: Option<ControllerSettings>,
}

impl Cli {
    /// The typed configuration, with the TLS files read.
    pub fn settings(&self) -> anyhow::Result<Settings> {
        let tls = TlsMaterial::from_files(&self.cert, &self.key, &self.client_ca)
            .context("cannot read the TLS material")?;
        let role = match &self.follow {
            Some(leader) => Role::Follower {
                leader: leader.clone(),
            },
            None => Role::Leader,
        };
        if !(self.time_scale > 0.0 && self.time_scale.is_finite()) {
            anyhow::bail!("--time-scale must be a positive number");
        }
        let timings = Timings {
            lease: self.lease,
            renew_interval: self.renew_interval,
            handle_lease: self.handle_lease,
            call_budget: self.call_budget,
            attempt_budget: self.attempt_budget,
            probe_interval: self.probe_interval,
            probe_timeout: self.attempt_budget / 3,
            reclaim_interval: Timings::default().reclaim_interval,
        }
        .scaled(self.time_scale);
        let state_dir = self.state_dir.clone().unwrap_or_default();
        let mut config = worker::Config::new(self.listen, state_dir, tls);
        config.role = role;
        config.timings = timings;
        config.dedup_capacity = self.dedup_capacity;
        config.compact_after = self.compact_after;
        config.volumes = self.volumes.clone();
        Ok(Settings {
            worker: config,
            token_file: self.token_file.clone(),
            controller: self.controller()?,
        })
    }

    fn controller(&self) -> anyhow::Result<Option<ControllerSettings>> {
        let Some(csi_endpoint) = &self.csi_endpoint else {
            return Ok(None);
        };
        if self.follow.is_some() {
            anyhow::bail!(
                "--csi-endpoint serves the reference controller, which runs in the leader: \
                 drop --follow or --csi-endpoint"
            );
        }
        let endpoint = UnixEndpoint::parse(csi_endpoint)
            .map_err(|e| anyhow::anyhow!("--csi-endpoint: {e}"))?;
        let credentials = match (
            &self.credentials_dir,
            &self.credentials_ca,
            &self.credentials_cert,
            &self.credentials_key,
        ) {
            (Some(dir), Some(ca), Some(cert), Some(key)) => Some(CredentialFiles {
                dir: dir.clone(),
                ca: ca.clone(),
                cert: cert.clone(),
                key: key.clone(),
            }),
            _ => None,
        };
        Ok(Some(ControllerSettings {
            endpoint,
            driver_name: self.driver_name.clone(),
            group_endpoints: self.group_endpoints.clone(),
            credential_namespace: self.credential_namespace.clone(),
            credentials,
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("3s").unwrap(), Duration::from_secs(3));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        assert!(parse_duration("3h").is_err());
        assert!(parse_duration("s").is_err());
    }

    #[test]
    fn help_documents_a_loopback_run() {
        use clap::CommandFactory as _;
        let help = Cli::command().render_long_help().to_string();
        for needle in [
            "RUNNING ON LOOPBACK",
            "openssl req -x509",
            "IP:127.0.0.1",
            "--follow",
        ] {
            assert!(help.contains(needle), "--help lacks {needle:?}");
        }
    }

    /// The flags every worker needs, then `role` (`--state-dir` or `--follow`), then `extra`.
    fn parse_as(role: &[&str], extra: &[&str]) -> Result<Cli, clap::Error> {
        let tls = [
            "--cert",
            "c",
            "--key",
            "k",
            "--client-ca",
            "ca",
            "--token-file",
            "t",
        ];
        let args = std::iter::once(&"tak-os-worker")
            .chain(&tls)
            .chain(role)
            .chain(extra);
        Cli::try_parse_from(args)
    }

    /// A leader's flags, then `extra`.
    fn parse(extra: &[&str]) -> Result<Cli, clap::Error> {
        parse_as(&["--state-dir", "/s"], extra)
    }

    #[test]
    fn flags_parse() {
        let cli = parse(&["--volume", "a:1:rwo", "--volume", "b:2:rwx"]).unwrap();
        assert_eq!(cli.volumes.len(), 2);
        assert!(Cli::try_parse_from(["tak-os-worker", "--cert", "c"]).is_err());
    }

    #[test]
    fn the_controller_is_off_by_default_and_configured_by_its_flags() {
        assert_eq!(parse(&[]).unwrap().controller().unwrap(), None);
        let cli = parse(&[
            "--csi-endpoint",
            "unix:///run/w/csi.sock",
            "--group-endpoint",
            "https://a:1,https://b:2",
            "--group-endpoint",
            "https://c:3",
            "--credentials-dir",
            "/creds",
            "--credentials-ca",
            "ca.pem",
            "--credentials-cert",
            "client.pem",
            "--credentials-key",
            "client.key",
        ])
        .unwrap();
        let controller = cli.controller().unwrap().unwrap();
        assert_eq!(controller.endpoint.path(), Path::new("/run/w/csi.sock"));
        assert_eq!(controller.driver_name, DEFAULT_DRIVER_NAME);
        assert_eq!(
            controller.group_endpoints,
            ["https://a:1", "https://b:2", "https://c:3"]
        );
        assert_eq!(controller.credential_namespace, None);
        assert_eq!(controller.credentials.unwrap().dir, PathBuf::from("/creds"));
    }

    #[test]
    fn controller_flags_that_cannot_work_are_refused() {
        // No group endpoints: volume contexts would name no worker.
        assert!(parse(&["--csi-endpoint", "unix:///x.sock"]).is_err());
        // Credentials need all four flags.
        assert!(parse(&["--credentials-dir", "/c", "--credentials-ca", "ca.pem"]).is_err());
        assert!(parse(&["--credentials-key", "k.pem"]).is_err());
        // A follower holds no volumes to create.
        let follower = parse_as(
            &["--follow", "127.0.0.1:1"],
            &[
                "--csi-endpoint",
                "unix:///x.sock",
                "--group-endpoint",
                "https://a:1",
            ],
        )
        .unwrap();
        let error = follower.controller().unwrap_err().to_string();
        assert!(error.contains("runs in the leader"), "{error}");
        let bad = parse(&[
            "--csi-endpoint",
            "tcp://x",
            "--group-endpoint",
            "https://a:1",
        ])
        .unwrap();
        assert!(
            bad.controller()
                .unwrap_err()
                .to_string()
                .contains("--csi-endpoint")
        );
    }
}
