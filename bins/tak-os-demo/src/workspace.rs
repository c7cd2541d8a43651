//! The demo's temporary directory: the store on its own tmpfs, kubelet's pod directories, the
//! driver's socket and log; and its removal, which never walks through a mount.

use std::ffi::CStr;
use std::io;
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use rustix::mount::{MountFlags, UnmountFlags};

/// The size of the store's tmpfs; pages are only used when written.
const STORE_TMPFS_OPTIONS: &CStr = c"size=256m,mode=0755";
/// How many rounds of unmounting cleanup tries before it gives up (stacked mounts need several).
const UNMOUNT_ROUNDS: usize = 8;

/// The demo's directory tree:
///
/// ```text
/// <root>/store/       the volume store, a tmpfs of its own (root-owned, 0755)
/// <root>/kubelet/     kubelet's root; targets are pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount
/// <root>/csi.sock     the driver's socket
/// <root>/driver.log   the driver's log
/// <root>/consumers/   the trusted consumers' root: the worker group's state is published here
/// <root>/worker/      the worker group: PKI, token file, credentials for the node, the
///                     controller's socket, logs (and its state, when no local volume holds it)
/// <root>/node/        the node's sockets (frontend, mount service, keeper) and logs
/// ```
#[derive(Debug)]
pub struct Workspace {
    root: PathBuf,
}

impl Workspace {
    /// Creates the tree in a fresh directory under the system's temporary directory and mounts
    /// the store's tmpfs. The caller must already be in a private mount namespace.
    pub fn create() -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("tak-os-demo.")
            .tempdir()
            .context("cannot create the temporary directory")?
            .keep();
        // The store and kubelet roots must be free of symlinks, and TMPDIR may contain one.
        let root = dir
            .canonicalize()
            .with_context(|| format!("cannot resolve {dir:?}"))?;
        let workspace = Workspace { root };
        if let Err(error) = workspace.populate() {
            // Best effort: the error that matters is the first one.
            let _ = workspace.remove();
            return Err(error);
        }
        Ok(workspace)
    }

    fn populate(&self) -> anyhow::Result<()> {
        // Kubelet's and the store's roots are traversed by the driver as root only, but a 0700
        // temporary directory would look odd next to a 0755 store.
        std::fs::set_permissions(&self.root, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("cannot chmod {:?}", self.root))?;
        let store = self.store();
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&store)
            .with_context(|| format!("cannot create {store:?}"))?;
        rustix::mount::mount(
            "tak-os-demo-store",
            &store,
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            STORE_TMPFS_OPTIONS,
        )
        .with_context(|| format!("cannot mount a tmpfs at {store:?}"))?;
        for dir in [
            self.kubelet_root(),
            self.consumers(),
            self.worker_dir(),
            self.node_dir(),
        ] {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&dir)
                .with_context(|| format!("cannot create {dir:?}"))?;
        }
        Ok(())
    }

    /// The temporary directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The volume store.
    pub fn store(&self) -> PathBuf {
        self.root.join("store")
    }

    /// Kubelet's root directory.
    pub fn kubelet_root(&self) -> PathBuf {
        self.root.join("kubelet")
    }

    /// The driver's socket.
    pub fn socket(&self) -> PathBuf {
        self.root.join("csi.sock")
    }

    /// The driver's log.
    pub fn driver_log(&self) -> PathBuf {
        self.root.join("driver.log")
    }

    /// The trusted consumers' root (the driver's `--consumer-mount-root`).
    pub fn consumers(&self) -> PathBuf {
        self.root.join("consumers")
    }

    /// The worker group's directory.
    pub fn worker_dir(&self) -> PathBuf {
        self.root.join("worker")
    }

    /// The node's directory: its sockets and logs.
    pub fn node_dir(&self) -> PathBuf {
        self.root.join("node")
    }

    /// Kubelet's target path for volume `pv` in pod `pod_uid`.
    pub fn target(&self, pod_uid: &str, pv: &str) -> PathBuf {
        self.kubelet_root()
            .join("pods")
            .join(pod_uid)
            .join("volumes")
            .join("kubernetes.io~csi")
            .join(pv)
            .join("mount")
    }

    /// Creates the target's parent as kubelet does before NodePublishVolume (the driver creates
    /// the target itself).
    pub fn create_target_parent(&self, target: &Path) -> io::Result<()> {
        match target.parent() {
            Some(parent) => std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o750)
                .create(parent),
            None => Ok(()),
        }
    }

    /// Unmounts everything at or below the directory, then removes it. When a mount cannot be
    /// unmounted nothing is removed: a recursive delete must never reach into a mount.
    pub fn remove(&self) -> anyhow::Result<()> {
        for _ in 0..UNMOUNT_ROUNDS {
            let mounts = self.mounts()?;
            if mounts.is_empty() {
                break;
            }
            // The table lists mounts in the order they were made, so the last one is on top.
            for mount_point in mounts.iter().rev() {
                // A failure shows up as a mount left over below.
                let _ = rustix::mount::unmount(mount_point, UnmountFlags::NOFOLLOW);
            }
        }
        let left = self.mounts()?;
        if !left.is_empty() {
            anyhow::bail!(
                "{} mount(s) below {:?} could not be unmounted ({}); the directory was left in place",
                left.len(),
                self.root,
                left.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        std::fs::remove_dir_all(&self.root)
            .with_context(|| format!("cannot remove {:?}", self.root))
    }

    /// The mount points at or below the directory, in table order.
    fn mounts(&self) -> anyhow::Result<Vec<PathBuf>> {
        let bytes = mountinfo::read_self().context("cannot read the mount table")?;
        let table = mountinfo::MountTable::parse(&bytes).context("cannot parse the mount table")?;
        Ok(table
            .mounts_at_or_below(&self.root)
            .map(|m| m.mount_point().to_owned())
            .collect())
    }
}
