//! Parsing `unix:///path` CSI endpoints.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::error::{EndpointProblem, Error};

/// The longest socket path Linux accepts: `sun_path` is 108 bytes including the final NUL.
pub const MAX_SOCKET_PATH_LEN: usize = 107;

/// A CSI endpoint on a Unix socket: the `unix:///absolute/path` form that kubelet and the
/// CSI sidecars use.
///
/// Only that form is accepted. `unix:/path` and `unix:path` are rejected (with a hint) rather
/// than guessed at, `unix://name/...` is rejected because `name` would be a host, and
/// `tcp://`, bare paths, queries and fragments are rejected. The path is taken literally:
/// there is no percent-decoding. Paths longer than [`MAX_SOCKET_PATH_LEN`] bytes are rejected.
///
/// [`Display`](fmt::Display) renders the endpoint back in the same form, so parsing the
/// rendered string gives the same value (for UTF-8 paths; others display lossily).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UnixEndpoint {
    path: PathBuf,
}

impl UnixEndpoint {
    /// Parses `unix:///absolute/path`.
    ///
    /// ```
    /// let endpoint = csi_proto::UnixEndpoint::parse("unix:///csi/csi.sock")?;
    /// assert_eq!(endpoint.path(), std::path::Path::new("/csi/csi.sock"));
    /// assert!(csi_proto::UnixEndpoint::parse("tcp://127.0.0.1:10000").is_err());
    /// # Ok::<(), csi_proto::Error>(())
    /// ```
    pub fn parse(endpoint: &str) -> Result<Self, Error> {
        parse_path(endpoint)
            .map_err(|problem| Error::InvalidEndpoint {
                endpoint: endpoint.to_owned(),
                problem,
            })
            .and_then(Self::from_path)
    }

    /// Builds an endpoint from a socket path, with the same checks as [`UnixEndpoint::parse`].
    pub fn from_path(path: impl Into<PathBuf>) -> Result<Self, Error> {
        use std::os::unix::ffi::OsStrExt;
        let path = path.into();
        let bytes = path.as_os_str().as_bytes();
        let problem = if bytes.is_empty() {
            Some(EndpointProblem::EmptyPath)
        } else if !bytes.starts_with(b"/") {
            Some(EndpointProblem::NotAbsolute)
        } else if bytes.ends_with(b"/") {
            Some(EndpointProblem::NoFileName)
        } else if bytes.contains(&0) {
            Some(EndpointProblem::NulByte)
        } else {
            None
        };
        match problem {
            Some(problem) => Err(Error::InvalidEndpoint {
                endpoint: format!("unix://{}", path.display()),
                problem,
            }),
            None => check_len(path),
        }
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Consumes the endpoint and returns its socket path.
    pub fn into_path(self) -> PathBuf {
        self.path
    }
}

fn check_len(path: PathBuf) -> Result<UnixEndpoint, Error> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH_LEN {
        return Err(Error::SocketPathTooLong {
            path,
            len,
            max: MAX_SOCKET_PATH_LEN,
        });
    }
    Ok(UnixEndpoint { path })
}

/// Splits off the scheme and returns the path, or says what is wrong with the string.
fn parse_path(endpoint: &str) -> Result<PathBuf, EndpointProblem> {
    let Some((scheme, rest)) = endpoint.split_once(':') else {
        return Err(EndpointProblem::MissingScheme);
    };
    if scheme.is_empty()
        || !scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    {
        return Err(EndpointProblem::MissingScheme);
    }
    if scheme != "unix" {
        return Err(EndpointProblem::UnsupportedScheme(scheme.to_owned()));
    }
    let Some(path) = rest.strip_prefix("//") else {
        return Err(EndpointProblem::MissingSlashes);
    };
    if path.contains(['?', '#']) {
        return Err(EndpointProblem::QueryOrFragment);
    }
    if path.is_empty() {
        return Err(EndpointProblem::EmptyPath);
    }
    if !path.starts_with('/') {
        return Err(EndpointProblem::NotAbsolute);
    }
    if path.ends_with('/') {
        return Err(EndpointProblem::NoFileName);
    }
    if path.contains('\0') {
        return Err(EndpointProblem::NulByte);
    }
    Ok(PathBuf::from(path))
}

impl FromStr for UnixEndpoint {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for UnixEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unix://{}", self.path.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(endpoint: &str) -> EndpointProblem {
        match UnixEndpoint::parse(endpoint) {
            Err(Error::InvalidEndpoint {
                problem,
                endpoint: given,
            }) => {
                assert_eq!(given, endpoint, "the error names the endpoint as given");
                problem
            }
            other => panic!("{endpoint:?}: expected InvalidEndpoint, got {other:?}"),
        }
    }

    #[test]
    fn accepts_absolute_unix_endpoints() {
        for (text, path) in [
            ("unix:///csi/csi.sock", "/csi/csi.sock"),
            (
                "unix:///var/lib/kubelet/plugins/csi.local.tak-os.org/csi.sock",
                "/var/lib/kubelet/plugins/csi.local.tak-os.org/csi.sock",
            ),
            ("unix:///s", "/s"),
            ("unix:///with space/and%41", "/with space/and%41"),
        ] {
            let endpoint = UnixEndpoint::parse(text).expect(text);
            assert_eq!(endpoint.path(), Path::new(path));
            assert_eq!(endpoint.to_string(), text, "display round-trips");
            assert_eq!(
                UnixEndpoint::parse(&endpoint.to_string()).expect(text),
                endpoint
            );
            assert_eq!(text.parse::<UnixEndpoint>().expect(text), endpoint);
        }
    }

    #[test]
    fn rejects_other_schemes() {
        assert_eq!(
            problem("tcp://127.0.0.1:10000"),
            EndpointProblem::UnsupportedScheme("tcp".into())
        );
        assert_eq!(
            problem("http://localhost/x"),
            EndpointProblem::UnsupportedScheme("http".into())
        );
        assert_eq!(
            problem("UNIX:///csi.sock"),
            EndpointProblem::UnsupportedScheme("UNIX".into())
        );
    }

    #[test]
    fn rejects_bare_paths() {
        assert_eq!(problem("/csi/csi.sock"), EndpointProblem::MissingScheme);
        assert_eq!(problem("csi.sock"), EndpointProblem::MissingScheme);
        assert_eq!(problem(""), EndpointProblem::MissingScheme);
        assert_eq!(problem("://x"), EndpointProblem::MissingScheme);
    }

    #[test]
    fn rejects_short_unix_forms_with_a_hint() {
        assert_eq!(
            problem("unix:/csi/csi.sock"),
            EndpointProblem::MissingSlashes
        );
        assert_eq!(problem("unix:csi.sock"), EndpointProblem::MissingSlashes);
        let message = UnixEndpoint::parse("unix:/csi.sock")
            .unwrap_err()
            .to_string();
        assert!(message.contains("unix:///absolute/path"), "{message}");
    }

    #[test]
    fn rejects_relative_and_empty_paths() {
        assert_eq!(
            problem("unix://relative/csi.sock"),
            EndpointProblem::NotAbsolute
        );
        assert_eq!(problem("unix://csi.sock"), EndpointProblem::NotAbsolute);
        assert_eq!(problem("unix://"), EndpointProblem::EmptyPath);
        assert_eq!(problem("unix:///"), EndpointProblem::NoFileName);
        assert_eq!(problem("unix:///csi/"), EndpointProblem::NoFileName);
    }

    #[test]
    fn rejects_query_fragment_and_nul() {
        assert_eq!(
            problem("unix:///csi.sock?x=1"),
            EndpointProblem::QueryOrFragment
        );
        assert_eq!(
            problem("unix:///csi.sock#frag"),
            EndpointProblem::QueryOrFragment
        );
        assert_eq!(problem("unix:///csi\0.sock"), EndpointProblem::NulByte);
    }

    #[test]
    fn rejects_paths_too_long_for_sockaddr_un() {
        let longest = format!("/{}", "a".repeat(MAX_SOCKET_PATH_LEN - 1));
        assert!(UnixEndpoint::parse(&format!("unix://{longest}")).is_ok());
        let too_long = format!("{longest}b");
        match UnixEndpoint::parse(&format!("unix://{too_long}")) {
            Err(Error::SocketPathTooLong { path, len, max }) => {
                assert_eq!(path, PathBuf::from(&too_long));
                assert_eq!((len, max), (MAX_SOCKET_PATH_LEN + 1, MAX_SOCKET_PATH_LEN));
            }
            other => panic!("expected SocketPathTooLong, got {other:?}"),
        }
    }

    #[test]
    fn from_path_applies_the_same_rules() {
        assert!(UnixEndpoint::from_path("/run/csi.sock").is_ok());
        for path in ["", "relative.sock", "/dir/"] {
            assert!(
                matches!(
                    UnixEndpoint::from_path(path),
                    Err(Error::InvalidEndpoint { .. })
                ),
                "{path:?}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn parse_then_display_round_trips(text in "(unix|tcp|UNIX)?:?/{0,4}[a-z./?#%\\x00 -]{0,120}") {
            if let Ok(endpoint) = UnixEndpoint::parse(&text) {
                proptest::prop_assert_eq!(endpoint.to_string(), text.clone());
                proptest::prop_assert_eq!(UnixEndpoint::parse(&endpoint.to_string()).ok(), Some(endpoint.clone()));
                proptest::prop_assert!(endpoint.path().is_absolute());
                proptest::prop_assert!(endpoint.path().as_os_str().len() <= MAX_SOCKET_PATH_LEN);
                proptest::prop_assert_eq!(UnixEndpoint::from_path(endpoint.path()).ok(), Some(endpoint));
            }
        }

        #[test]
        fn parse_never_panics(text in "\\PC{0,200}") {
            let _ = UnixEndpoint::parse(&text);
        }
    }

    #[test]
    fn error_message_names_the_endpoint_and_problem() {
        let message = UnixEndpoint::parse("tcp://10.0.0.1:9000")
            .unwrap_err()
            .to_string();
        assert!(message.contains("tcp://10.0.0.1:9000"), "{message}");
        assert!(message.contains("only unix:///"), "{message}");
    }
}
