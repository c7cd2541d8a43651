//! Where a volume's worker credentials come from: the [`CredentialSource`] trait, the material
//! it yields, and the directory source for development and tests.
//!
//! Every source yields the same keys, whether as the data keys of the Kubernetes Secret
//! `<volumeID>-auth` or as the files of a volume's directory:
//!
//! | key | content | required |
//! |---|---|---|
//! | `token` | the file-service bearer token the workers accept now | yes |
//! | `next-token` | during a token rotation, the token that replaces `token`; the workers accept both from the moment it appears, and the node uses it at once | no |
//! | `ca.crt` | PEM CA bundle the workers' certificates chain to; during a CA rotation it holds the old and the new CA | yes |
//! | `tls.crt` | PEM client certificate chain, the certificate first | yes |
//! | `tls.key` | PEM private key of the client certificate | yes |
//!
//! Nothing here logs or shows credential material: `Debug` of [`Material`] names no secret.

use std::fmt;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

pub mod kube;

pub use replicated_contract::credentials::{
    CA_BUNDLE, CLIENT_CERTIFICATE, CLIENT_KEY, NEXT_TOKEN, TOKEN,
};

/// The largest value of one key that is read (a CA bundle of many certificates fits easily).
pub const MAX_VALUE_BYTES: u64 = 1 << 20;

/// A volume's credential material, as a source holds it.
#[derive(Clone, PartialEq, Eq)]
pub struct Material {
    token: String,
    next_token: Option<String>,
    ca_bundle: Vec<u8>,
    client_chain: Vec<u8>,
    client_key: Vec<u8>,
}

impl Material {
    /// Material from its parts, as a source reads them.
    pub fn new(
        token: String,
        next_token: Option<String>,
        ca_bundle: Vec<u8>,
        client_chain: Vec<u8>,
        client_key: Vec<u8>,
    ) -> Self {
        Material {
            token,
            next_token,
            ca_bundle,
            client_chain,
            client_key,
        }
    }

    /// The client's credentials: the next token when a rotation is under way, else the token.
    pub fn credentials(&self) -> Result<lease_client::Credentials, CredentialError> {
        let token = self.next_token.as_deref().unwrap_or(&self.token);
        lease_client::Credentials::from_pem(
            token.trim_end(),
            &self.ca_bundle,
            &self.client_chain,
            &self.client_key,
        )
        .map_err(|error| CredentialError::Malformed {
            what: match &error {
                lease_client::ConfigError::InvalidCredentials { what, .. } => what,
                lease_client::ConfigError::InvalidEndpoint { .. }
                | lease_client::ConfigError::NoEndpoints => "credentials",
            },
            reason: error_text::chain(&error),
        })
    }
}

impl fmt::Debug for Material {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Material")
            .field("token", &"<redacted>")
            .field(
                "next_token",
                &self.next_token.as_ref().map(|_| "<redacted>"),
            )
            .field("ca_bundle_bytes", &self.ca_bundle.len())
            .field("client_chain_bytes", &self.client_chain.len())
            .field("client_key", &"<redacted>")
            .finish()
    }
}

/// Why a volume's credentials cannot be had. Messages name keys and places, never content.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// The source has nothing for this volume.
    #[error("no credentials for the volume: {place} does not exist")]
    Missing {
        /// Where they were looked for (a directory, or a Secret's namespace and name).
        place: String,
    },
    /// A required key is absent.
    #[error("the credentials in {place} lack {key:?}")]
    MissingKey {
        /// Where.
        place: String,
        /// The key.
        key: &'static str,
    },
    /// The material does not make usable credentials.
    #[error("the credentials' {what} is unusable: {reason}")]
    Malformed {
        /// Which part ("token", "CA bundle", "client certificate", "client key", ...).
        what: &'static str,
        /// Why, without the content.
        reason: String,
    },
    /// The source could not be read (an API server that does not answer, an I/O error).
    #[error("the credentials in {place} cannot be read")]
    Unavailable {
        /// Where.
        place: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// The future [`CredentialSource::load`] returns.
pub type Load<'a> = Pin<Box<dyn Future<Output = Result<Material, CredentialError>> + Send + 'a>>;

/// The future [`CredentialSource::changed`] returns.
pub type Changed<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Where the owner gets a volume's credentials. `volume_id` has been validated (lowercase
/// letters, digits, `-` and `.`, as in a Kubernetes object name), so a source may use it in a
/// path or a name.
///
/// The owner loads a volume's material when it stages the volume, then keeps one refresh task
/// per stage: it waits for [`changed`](Self::changed), loads again, and swaps the new
/// credentials into the live client when they differ (calls in flight finish with the old).
pub trait CredentialSource: Send + Sync + 'static {
    /// The current material of `volume_id`'s credentials.
    fn load<'a>(&'a self, volume_id: &'a str) -> Load<'a>;

    /// Resolves when `volume_id`'s credentials may have changed since this future was made
    /// (a spurious wake-up is harmless: the owner compares what it loads). A source that
    /// cannot tell resolves after a polling interval.
    fn changed<'a>(&'a self, volume_id: &'a str) -> Changed<'a>;

    /// The volume is no longer staged here: a source that caches may drop what it holds for
    /// it. Does nothing by default.
    fn forget(&self, volume_id: &str) {
        let _ = volume_id;
    }
}

/// Credentials from files: `<dir>/<volumeID>/<key>`, for development and the demo. Each read
/// opens the files afresh, so rewriting them rotates the credentials; [`changed`] is a poll
/// every [`DirectorySource::poll_interval`].
///
/// [`changed`]: CredentialSource::changed
#[derive(Debug, Clone)]
pub struct DirectorySource {
    root: PathBuf,
    poll_interval: Duration,
}

impl DirectorySource {
    /// How often, by default, the owner looks at the files again.
    pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(10);

    /// A source over the directory `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        DirectorySource {
            root: root.into(),
            poll_interval: Self::DEFAULT_POLL_INTERVAL,
        }
    }

    /// The same source, polled every `interval`.
    #[must_use]
    pub fn with_poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// How often the owner looks at the files again.
    pub fn poll_interval(&self) -> Duration {
        self.poll_interval
    }

    fn read(&self, volume_id: &str) -> Result<Material, CredentialError> {
        let dir = self.root.join(volume_id);
        let place = dir.display().to_string();
        let unavailable = |source: io::Error| CredentialError::Unavailable {
            place: place.clone(),
            source: Box::new(source),
        };
        match std::fs::symlink_metadata(&dir) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(CredentialError::Malformed {
                    what: "directory",
                    reason: format!("{place} is not a directory"),
                });
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(CredentialError::Missing { place });
            }
            Err(e) => return Err(unavailable(e)),
        }
        let optional = |key: &'static str| read_limited(&dir.join(key)).map_err(unavailable);
        let required = |key: &'static str| {
            optional(key)?.ok_or_else(|| CredentialError::MissingKey {
                place: place.clone(),
                key,
            })
        };
        let text = |key: &'static str, bytes: Vec<u8>| {
            String::from_utf8(bytes).map_err(|_| CredentialError::Malformed {
                what: key,
                reason: "it is not UTF-8".to_owned(),
            })
        };
        let token = text(TOKEN, required(TOKEN)?)?;
        let next_token = optional(NEXT_TOKEN)?
            .map(|bytes| text(NEXT_TOKEN, bytes))
            .transpose()?
            .filter(|token| !token.trim().is_empty());
        Ok(Material::new(
            token,
            next_token,
            required(CA_BUNDLE)?,
            required(CLIENT_CERTIFICATE)?,
            required(CLIENT_KEY)?,
        ))
    }
}

/// Reads a file of at most [`MAX_VALUE_BYTES`]; `None` when it does not exist.
fn read_limited(path: &Path) -> io::Result<Option<Vec<u8>>> {
    use std::io::Read as _;
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    file.take(MAX_VALUE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_VALUE_BYTES {
        return Err(io::Error::other(format!(
            "{} is over {MAX_VALUE_BYTES} bytes",
            path.display()
        )));
    }
    Ok(Some(bytes))
}

impl CredentialSource for DirectorySource {
    fn load<'a>(&'a self, volume_id: &'a str) -> Load<'a> {
        Box::pin(async move { self.read(volume_id) })
    }

    fn changed<'a>(&'a self, _volume_id: &'a str) -> Changed<'a> {
        Box::pin(tokio::time::sleep(self.poll_interval))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, files: &[(&str, &[u8])]) {
        std::fs::create_dir_all(dir).unwrap();
        for (name, content) in files {
            std::fs::write(dir.join(name), content).unwrap();
        }
    }

    fn load(source: &DirectorySource, volume: &str) -> Result<Material, CredentialError> {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(source.load(volume))
    }

    #[test]
    fn a_volume_directory_yields_its_material_and_the_next_token_wins() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("vol-1");
        write(
            &dir,
            &[
                (TOKEN, b"old-secret\n"),
                (CA_BUNDLE, b"ca"),
                (CLIENT_CERTIFICATE, b"crt"),
                (CLIENT_KEY, b"key"),
            ],
        );
        let source = DirectorySource::new(root.path());
        let material = load(&source, "vol-1").unwrap();
        assert_eq!(material.token, "old-secret\n");
        assert_eq!(material.next_token, None);
        write(&dir, &[(NEXT_TOKEN, b"new-secret")]);
        let material = load(&source, "vol-1").unwrap();
        assert_eq!(material.next_token.as_deref(), Some("new-secret"));
        let shown = format!("{material:?}");
        assert!(
            !shown.contains("secret") && !shown.contains("key\""),
            "{shown}"
        );
        // Not PEM: refused, and the message quotes nothing.
        let error = material.credentials().unwrap_err();
        assert!(
            matches!(error, CredentialError::Malformed { .. }),
            "{error:?}"
        );
        assert!(!error_text::chain(&error).contains("secret"), "{error}");
    }

    #[test]
    fn missing_material_says_what_is_missing_and_where() {
        let root = tempfile::tempdir().unwrap();
        let source = DirectorySource::new(root.path());
        assert!(matches!(
            load(&source, "vol-1"),
            Err(CredentialError::Missing { .. })
        ));
        write(
            &root.path().join("vol-1"),
            &[(TOKEN, b"t"), (CA_BUNDLE, b"ca")],
        );
        let error = load(&source, "vol-1").unwrap_err();
        assert!(
            matches!(
                error,
                CredentialError::MissingKey {
                    key: CLIENT_CERTIFICATE,
                    ..
                }
            ),
            "{error:?}"
        );
        assert!(error.to_string().contains("vol-1"), "{error}");
    }
}
