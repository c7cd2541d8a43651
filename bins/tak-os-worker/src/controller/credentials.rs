//! Development credentials: for each volume it creates, the controller writes the files the
//! node's directory credential source reads (`<dir>/<volume-id>/{ca.crt,tls.crt,tls.key,token}`),
//! from one client identity and the worker's current first token. In a cluster the manager
//! puts them in a Secret instead; this stands in for it on one machine.
//!
//! Removal unlinks exactly the files this module knows, then the directory: never a recursive
//! delete.

use std::fs::File;
use std::os::fd::AsFd as _;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};

use replicated_contract::credentials::{
    CA_BUNDLE, CLIENT_CERTIFICATE, CLIENT_KEY, NEXT_TOKEN, TOKEN,
};

/// Where the credentials go and what they are made of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CredentialFiles {
    /// The directory the node's `--credentials-dir` names.
    pub dir: PathBuf,
    /// The CA bundle nodes verify the workers' certificates with.
    pub ca: PathBuf,
    /// The client certificate (chain) handed to nodes.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

/// Why credentials could not be written or removed.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// A source file could not be read.
    #[error("cannot read {path:?}")]
    Source {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: anyhow::Error,
    },
    /// The volume's directory could not be made, opened or removed.
    #[error("cannot {action} {path:?}")]
    Directory {
        /// What was tried.
        action: &'static str,
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A file could not be written or removed.
    #[error("cannot update the credentials in {path:?}")]
    File {
        /// The volume's directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: durable::Error,
    },
}

impl CredentialFiles {
    /// Writes the credentials of `volume_id` with `token`, replacing older ones.
    pub fn write(&self, volume_id: &str, token: &str) -> Result<(), CredentialError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|e| CredentialError::Source {
                path: path.to_owned(),
                source: e.into(),
            })
        };
        let files = [
            (CA_BUNDLE, read(&self.ca)?),
            (CLIENT_CERTIFICATE, read(&self.cert)?),
            (CLIENT_KEY, read(&self.key)?),
            (TOKEN, token.as_bytes().to_vec()),
        ];
        let path = self.dir.join(volume_id);
        let dir = |action, source| CredentialError::Directory {
            action,
            path: path.clone(),
            source,
        };
        match std::fs::DirBuilder::new().mode(0o700).create(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(dir("create", e)),
        }
        let handle = open_dir(&path).map_err(|e| dir("open", e))?;
        let options = durable::Options {
            mode: 0o600,
            replace: durable::Replace::Yes,
        };
        for (name, bytes) in files {
            durable::write(handle.as_fd(), name, &bytes, options).map_err(|source| {
                CredentialError::File {
                    path: path.clone(),
                    source,
                }
            })?;
        }
        // A rotation left half-way by an earlier process must not override the new token.
        durable::remove(handle.as_fd(), NEXT_TOKEN).map_err(|source| CredentialError::File {
            path: path.clone(),
            source,
        })?;
        Ok(())
    }

    /// Removes the credentials of `volume_id`; nothing to remove is success.
    pub fn remove(&self, volume_id: &str) -> Result<(), CredentialError> {
        let path = self.dir.join(volume_id);
        let handle = match open_dir(&path) {
            Ok(handle) => handle,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => {
                return Err(CredentialError::Directory {
                    action: "open",
                    path,
                    source: e,
                });
            }
        };
        for name in [CA_BUNDLE, CLIENT_CERTIFICATE, CLIENT_KEY, TOKEN, NEXT_TOKEN] {
            let file = |source| CredentialError::File {
                path: path.clone(),
                source,
            };
            durable::remove_temp(handle.as_fd(), name).map_err(file)?;
            durable::remove(handle.as_fd(), name).map_err(file)?;
        }
        drop(handle);
        match std::fs::remove_dir(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(CredentialError::Directory {
                action: "remove (it holds files this controller did not write)",
                path,
                source,
            }),
        }
    }
}

/// Opens a directory without following a symbolic link at its last component.
fn open_dir(path: &Path) -> std::io::Result<File> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(File::from(rustix::fs::open(path, flags, Mode::empty())?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(root: &Path) -> CredentialFiles {
        for (name, text) in [
            ("ca.pem", "CA"),
            ("client.pem", "CERT"),
            ("client.key", "KEY"),
        ] {
            std::fs::write(root.join(name), text).unwrap();
        }
        std::fs::create_dir(root.join("out")).unwrap();
        CredentialFiles {
            dir: root.join("out"),
            ca: root.join("ca.pem"),
            cert: root.join("client.pem"),
            key: root.join("client.key"),
        }
    }

    #[test]
    fn written_as_the_node_reads_them_and_removed_without_a_trace() {
        use std::os::unix::fs::PermissionsExt as _;
        let root = tempfile::tempdir().unwrap();
        let files = files(root.path());
        files.write("pvc-1", "t0k3n").unwrap();
        let dir = root.path().join("out/pvc-1");
        for (name, text) in [
            (CA_BUNDLE, "CA"),
            (CLIENT_CERTIFICATE, "CERT"),
            (CLIENT_KEY, "KEY"),
            (TOKEN, "t0k3n"),
        ] {
            assert_eq!(std::fs::read_to_string(dir.join(name)).unwrap(), text);
            let mode = std::fs::metadata(dir.join(name))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{name}");
        }
        std::fs::write(dir.join(NEXT_TOKEN), "old rotation").unwrap();
        files.write("pvc-1", "n3w").unwrap();
        assert_eq!(std::fs::read_to_string(dir.join(TOKEN)).unwrap(), "n3w");
        assert!(!dir.join(NEXT_TOKEN).exists());
        files.remove("pvc-1").unwrap();
        assert!(!dir.exists());
        files.remove("pvc-1").unwrap();
    }

    #[test]
    fn a_foreign_file_stops_the_removal_instead_of_being_deleted() {
        let root = tempfile::tempdir().unwrap();
        let files = files(root.path());
        files.write("pvc-1", "t").unwrap();
        let dir = root.path().join("out/pvc-1");
        std::fs::write(dir.join("notes"), "mine").unwrap();
        let error = files.remove("pvc-1").unwrap_err();
        assert!(error.to_string().contains("did not write"), "{error}");
        assert_eq!(std::fs::read_to_string(dir.join("notes")).unwrap(), "mine");
    }

    #[test]
    fn a_missing_source_names_the_file_and_writes_nothing() {
        let root = tempfile::tempdir().unwrap();
        let mut files = files(root.path());
        files.key = root.path().join("absent.key");
        let error = files.write("pvc-1", "t").unwrap_err();
        assert!(error.to_string().contains("absent.key"), "{error}");
        assert!(!root.path().join("out/pvc-1").exists());
    }
}
