//! A worker, a client and a mount, all in one test process.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fusefs::{Fs, FsConfig, Mounted};
use lease_client::protocol::{MountEpoch, VolumeGeneration};
use lease_client::{
    Budgets, Client, ClientConfig, EndpointSet, HttpsTransport, LeaseConfig, MountLease,
};
use tempfile::TempDir;
use worker::testing::{Pki, leader, volume};
use worker::{AccessMode, Server, Timings, VolumeSpec};

/// Every duration is the default times this factor: a 1.5 s call budget, a 9 s lease.
pub(crate) const SCALE: f64 = 0.1;
pub(crate) const TOKEN: &str = "fusefs-test-token";

pub(crate) type TestFs = Fs<Client<HttpsTransport>>;

/// A worker serving one volume from a temporary directory.
pub(crate) struct Volume {
    pub(crate) dir: TempDir,
    pub(crate) pki: Pki,
    pub(crate) spec: VolumeSpec,
    pub(crate) server: Option<Server>,
}

impl Volume {
    pub(crate) async fn start(access_mode: AccessMode) -> Volume {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::generate("fusefs").unwrap();
        let spec = volume("v1.fusefs-test", access_mode);
        let server = leader(
            &pki,
            &dir.path().join("worker"),
            std::slice::from_ref(&spec),
            TOKEN,
            Timings::default().scaled(SCALE),
        )
        .await
        .unwrap();
        Volume {
            dir,
            pki,
            spec,
            server: Some(server),
        }
    }

    pub(crate) fn server(&self) -> &Server {
        self.server.as_ref().unwrap()
    }

    pub(crate) fn endpoint(&self) -> String {
        self.server().endpoint()
    }

    pub(crate) fn client(&self) -> Client<HttpsTransport> {
        let budgets = Budgets::default().scaled(SCALE);
        let config = ClientConfig {
            volume_id: self.spec.volume_id.clone(),
            volume_generation: VolumeGeneration(self.spec.volume_generation),
            access_mode: self.spec.access_mode.to_wire(),
            endpoints: EndpointSet::new([self.endpoint()]).unwrap(),
            budgets,
        };
        Client::new(
            config,
            HttpsTransport::with_credentials(&budgets, &self.pki.credentials(TOKEN).unwrap()),
        )
    }

    /// Where the worker keeps the volume's files (the backing directory).
    pub(crate) fn backing_dir(&self) -> PathBuf {
        self.dir
            .path()
            .join("worker/volumes")
            .join(&self.spec.volume_id)
            .join("data")
    }

    /// A fresh, empty mount point.
    pub(crate) fn mount_point(&self, name: &str) -> PathBuf {
        let path = self.dir.path().join("mnt").join(name);
        std::fs::create_dir_all(&path).unwrap();
        path
    }
}

/// A mounted volume with its handle renewal running.
#[allow(dead_code, reason = "tests use the parts they need")]
pub(crate) struct Mount {
    pub(crate) fs: Arc<TestFs>,
    pub(crate) mounted: Option<Mounted>,
    pub(crate) lease: Option<MountLease<HttpsTransport>>,
    renewal: tokio::task::JoinHandle<()>,
}

impl Mount {
    /// Mounts the volume at `path`; an RWO volume claims a lease as node `node` first.
    pub(crate) async fn new(volume: &Volume, path: &Path, node: &str) -> Mount {
        let mut client = volume.client();
        let mut lease = None;
        if volume.spec.access_mode == AccessMode::Rwo {
            let epoch = MountEpoch::random().unwrap();
            let claim = MountLease::new(&client, epoch, node, LeaseConfig::default().scaled(SCALE));
            let call = claim.prepare_claim().unwrap();
            claim.claim(&call).await.unwrap();
            client = client.with_epoch(epoch);
            lease = Some(claim);
        }
        let fs = Arc::new(Fs::new(client, FsConfig::default()));
        let renewal = tokio::spawn({
            let fs = Arc::clone(&fs);
            async move { fs.run_handle_renewal().await }
        });
        let mounted = fusefs::mount(Arc::clone(&fs), &volume.spec.volume_id, path)
            .await
            .unwrap();
        Mount {
            fs,
            mounted: Some(mounted),
            lease,
            renewal,
        }
    }

    pub(crate) fn path(&self) -> &Path {
        self.mounted.as_ref().unwrap().path()
    }

    pub(crate) async fn unmount(mut self) {
        self.renewal.abort();
        self.mounted
            .take()
            .unwrap()
            .unmount(Duration::from_secs(5))
            .await
            .unwrap();
    }
}

/// A multi-threaded runtime for the FUSE sessions, built after the namespace switch so its
/// threads live in the private namespace; the test thread itself does the file I/O.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
}
