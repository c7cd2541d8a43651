//! The reference worker serving one volume over loopback TLS, and fusefs mounts of it: the
//! setup that fusefs's tests, example and benchmark share, and that crates embedding fusefs
//! (the replicated node) use in theirs. Behind the `testing` feature; mounting needs root.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use fusefs::testing::WorkerVolume;
//! use fusefs::FsConfig;
//! use worker::{AccessMode, Timings};
//!
//! let state = tempfile::tempdir()?;
//! let volume =
//!     WorkerVolume::start(state.path(), "v1.example", AccessMode::Rwx, Timings::default())
//!         .await?;
//! let mount_point = state.path().join("mnt");
//! std::fs::create_dir(&mount_point)?;
//! let mut mounted = volume
//!     .mount(&mount_point, lease_client::Budgets::default(), FsConfig::default())
//!     .await?;
//! std::fs::write(mount_point.join("hello"), b"through the worker")?;
//! mounted.unmount(std::time::Duration::from_secs(5)).await?;
//! volume.stop().await;
//! # Ok(())
//! # }
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lease_client::{Budgets, Client, HttpsTransport};
use worker::testing::Pki;
use worker::{AccessMode, Config, Server, SystemClock, Timings, Tokens, VolumeSpec};

use crate::{Fs, FsConfig, MountError, Mounted};

/// Why the test worker did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The throwaway certificates could not be made.
    #[error("cannot make the test PKI")]
    Pki(#[from] worker::testing::PkiError),
    /// The worker refused to start.
    #[error("cannot start the test worker")]
    Worker(#[from] worker::Error),
}

/// The bearer token the worker accepts and clients present.
pub const TOKEN: &str = "fusefs-testing-token";

/// A reference worker (one leader) serving one volume from a state directory, with a throwaway
/// PKI, on a loopback port that stays the same when the worker is restarted.
#[derive(Debug)]
pub struct WorkerVolume {
    pki: Pki,
    spec: VolumeSpec,
    server: Option<Server>,
    state_dir: PathBuf,
    timings: Timings,
    address: SocketAddr,
}

impl WorkerVolume {
    /// Starts a worker whose state lives in `<state_dir>/worker`, serving volume `volume_id`
    /// (generation 1) with `access_mode` and `timings`.
    pub async fn start(
        state_dir: &Path,
        volume_id: &str,
        access_mode: AccessMode,
        timings: Timings,
    ) -> Result<WorkerVolume, StartError> {
        let pki = Pki::generate(volume_id)?;
        let spec = worker::testing::volume(volume_id, access_mode);
        let state_dir = state_dir.join("worker");
        let server = worker::testing::leader(
            &pki,
            &state_dir,
            std::slice::from_ref(&spec),
            TOKEN,
            timings,
        )
        .await?;
        let address = server.local_addr();
        Ok(WorkerVolume {
            pki,
            spec,
            server: Some(server),
            state_dir,
            timings,
            address,
        })
    }

    /// The volume's identity.
    pub fn spec(&self) -> &VolumeSpec {
        &self.spec
    }

    /// The throwaway PKI (CA, server and client certificates).
    pub fn pki(&self) -> &Pki {
        &self.pki
    }

    /// The running worker.
    ///
    /// # Panics
    /// While the worker is stopped ([`WorkerVolume::stop_worker`]).
    pub fn server(&self) -> &Server {
        match &self.server {
            Some(server) => server,
            None => panic!("the worker of {} is stopped", self.spec.volume_id),
        }
    }

    /// The worker's endpoint, `127.0.0.1:<port>`; the same across a restart.
    pub fn endpoint(&self) -> String {
        self.address.to_string()
    }

    /// Where the worker keeps the volume's files.
    pub fn backing_dir(&self) -> PathBuf {
        self.state_dir
            .join("volumes")
            .join(&self.spec.volume_id)
            .join("data")
    }

    /// A client of the volume with `budgets`, authenticated with the PKI's client certificate.
    pub fn client(&self, budgets: Budgets) -> Client<HttpsTransport> {
        match worker::testing::client(&self.pki, &self.spec, &self.endpoint(), TOKEN, budgets) {
            Ok(client) => client,
            // The PKI and the endpoint are made here and always valid.
            Err(e) => panic!("a client of the test worker: {e}"),
        }
    }

    /// [`WorkerVolume::client`], with its connections run on `runtime` (a serving thread's,
    /// say: [`crate::ServingThreads`]).
    pub fn client_on(
        &self,
        budgets: Budgets,
        runtime: tokio::runtime::Handle,
    ) -> Client<HttpsTransport> {
        let endpoint = self.endpoint();
        match worker::testing::client_on(&self.pki, &self.spec, &endpoint, TOKEN, budgets, runtime)
        {
            Ok(client) => client,
            // The PKI and the endpoint are made here and always valid.
            Err(e) => panic!("a client of the test worker: {e}"),
        }
    }

    /// Mounts the volume at `path` (an existing empty directory) through a new client. For an
    /// RWX volume; an RWO volume's client must carry a claimed epoch: mount it with
    /// [`crate::mount`] and [`lease_client::Client::with_epoch`].
    pub async fn mount(
        &self,
        path: &Path,
        budgets: Budgets,
        config: FsConfig,
    ) -> Result<Mounted<Client<HttpsTransport>>, MountError> {
        let fs = Arc::new(Fs::new(self.client(budgets), config)?);
        crate::mount(fs, &self.spec.volume_id, path).await
    }

    /// Stops the worker: its port refuses connections until [`WorkerVolume::start_worker_again`].
    pub async fn stop_worker(&mut self) {
        if let Some(server) = self.server.take() {
            server.stop().await;
        }
    }

    /// Starts a worker on the same address and state directory, as a restarted worker process
    /// would: leases, inode numbers and generations survive; open handles do not.
    pub async fn start_worker_again(&mut self) -> Result<(), worker::Error> {
        let mut config = Config::new(self.address, &self.state_dir, self.pki.tls());
        config.timings = self.timings;
        config.reopen = worker::testing::reopen_for_this_process();
        config.volumes = vec![self.spec.clone()];
        let server = Server::start(config, Tokens::new([TOKEN]), Arc::new(SystemClock)).await?;
        self.server = Some(server);
        Ok(())
    }

    /// Stops the worker for good.
    pub async fn stop(mut self) {
        self.stop_worker().await;
    }
}
