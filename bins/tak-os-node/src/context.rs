//! The volume context contract: what the manager that creates replicated volumes hands the node
//! in `volume_context`, and its validation.
//!
//! | key | value | required |
//! |---|---|---|
//! | `replicated.tak-os.org/generation` | the volume generation, a decimal `u64` | yes |
//! | `replicated.tak-os.org/endpoints` | 1 to 16 worker endpoints `https://host:port`, comma-separated | yes |
//! | `replicated.tak-os.org/access-mode` | `rwx` or `rwo` | no (`rwx`) |
//! | `replicated.tak-os.org/credential-namespace` | the namespace of the volume's Secret | no |
//!
//! Keys this contract does not name are ignored (provisioners and kubelet add their own). An
//! error names the key and quotes the value, except for endpoints: a refused endpoint may carry
//! a credential, so it is named by its position only.

use std::collections::HashMap;
use std::fmt;

use lease_client::EndpointSet;

/// The key of the volume generation.
pub const GENERATION: &str = "replicated.tak-os.org/generation";
/// The key of the worker endpoints.
pub const ENDPOINTS: &str = "replicated.tak-os.org/endpoints";
/// The key of the access mode.
pub const ACCESS_MODE: &str = "replicated.tak-os.org/access-mode";
/// The key of the credential namespace.
pub const CREDENTIAL_NAMESPACE: &str = "replicated.tak-os.org/credential-namespace";

/// Most worker endpoints a volume may have.
pub const MAX_ENDPOINTS: usize = 16;

/// The scheme every endpoint must have.
const SCHEME: &str = "https://";

/// How a volume may be shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VolumeMode {
    /// Mounted on any number of nodes at once (`rwx`).
    Rwx,
    /// Mounted on one node at a time, under a quorum-ordered lease (`rwo`).
    Rwo,
}

impl VolumeMode {
    /// The name in the volume context.
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeMode::Rwx => "rwx",
            VolumeMode::Rwo => "rwo",
        }
    }
}

impl fmt::Display for VolumeMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A validated volume context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeContext {
    /// The volume generation: a volume ID reused after deletion gets a new one.
    pub generation: u64,
    /// The worker endpoints as given (`https://host:port`), in order, without repeats.
    pub endpoint_urls: Vec<String>,
    /// The same endpoints as `host:port`, for the worker client.
    pub endpoints: EndpointSet,
    /// How the volume may be shared.
    pub mode: VolumeMode,
}

/// What is wrong with a volume context.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ContextError {
    /// A required key is absent or empty.
    #[error("volume_context[{key:?}] is required")]
    Missing {
        /// The key.
        key: &'static str,
    },
    /// A value is malformed; it is quoted (never an endpoint's).
    #[error("volume_context[{key:?}] = {value:?} is invalid: expected {expected}")]
    Malformed {
        /// The key.
        key: &'static str,
        /// The value as given.
        value: String,
        /// What the contract expects.
        expected: &'static str,
    },
    /// An endpoint is malformed; it is never quoted.
    #[error(
        "volume_context[{ENDPOINTS:?}] entry {position} is invalid: {problem} (expected https://host:port)"
    )]
    Endpoint {
        /// Its position in the list, counting from 1.
        position: usize,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// More endpoints than [`MAX_ENDPOINTS`].
    #[error(
        "volume_context[{ENDPOINTS:?}] has {count} endpoints; at most {MAX_ENDPOINTS} are allowed"
    )]
    TooManyEndpoints {
        /// How many there are.
        count: usize,
    },
    /// The credential namespace is not the one this owner reads from.
    #[error(
        "volume_context[{CREDENTIAL_NAMESPACE:?}] = {found:?} is not this driver's credential namespace {expected:?}: credentials are read only from the driver's own namespace"
    )]
    ForeignNamespace {
        /// The namespace the context names.
        found: String,
        /// The driver's namespace.
        expected: String,
    },
}

impl VolumeContext {
    /// Validates `context` for an owner that reads credentials from `credential_namespace`.
    pub fn parse(
        context: &HashMap<String, String>,
        credential_namespace: &str,
    ) -> Result<Self, ContextError> {
        let value = |key: &'static str| {
            context
                .get(key)
                .map(String::as_str)
                .filter(|v| !v.is_empty())
        };
        let generation = value(GENERATION).ok_or(ContextError::Missing { key: GENERATION })?;
        let generation = parse_generation(generation)?;
        let endpoints = value(ENDPOINTS).ok_or(ContextError::Missing { key: ENDPOINTS })?;
        let endpoint_urls = parse_endpoints(endpoints)?;
        // Every entry was checked on its own above; the set of them cannot be refused.
        let endpoints = EndpointSet::new(endpoint_urls.iter().map(|url| &url[SCHEME.len()..]))
            .map_err(|_| ContextError::Missing { key: ENDPOINTS })?;
        let mode = match value(ACCESS_MODE) {
            None | Some("rwx") => VolumeMode::Rwx,
            Some("rwo") => VolumeMode::Rwo,
            Some(other) => {
                return Err(ContextError::Malformed {
                    key: ACCESS_MODE,
                    value: other.to_owned(),
                    expected: "rwx or rwo",
                });
            }
        };
        if let Some(namespace) = value(CREDENTIAL_NAMESPACE)
            && namespace != credential_namespace
        {
            return Err(ContextError::ForeignNamespace {
                found: namespace.to_owned(),
                expected: credential_namespace.to_owned(),
            });
        }
        Ok(VolumeContext {
            generation,
            endpoint_urls,
            endpoints,
            mode,
        })
    }
}

fn parse_generation(value: &str) -> Result<u64, ContextError> {
    let malformed = || ContextError::Malformed {
        key: GENERATION,
        value: value.to_owned(),
        expected: "a decimal number from 0 to 18446744073709551615",
    };
    // `u64::from_str` also takes a leading `+`; the contract is digits only.
    if !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed());
    }
    value.parse().map_err(|_| malformed())
}

/// Splits and checks the endpoint list; repeats are dropped, the first kept.
fn parse_endpoints(value: &str) -> Result<Vec<String>, ContextError> {
    let entries: Vec<&str> = value.split(',').map(str::trim).collect();
    if entries.len() > MAX_ENDPOINTS {
        return Err(ContextError::TooManyEndpoints {
            count: entries.len(),
        });
    }
    let mut urls: Vec<String> = Vec::with_capacity(entries.len());
    for (index, entry) in entries.into_iter().enumerate() {
        let endpoint = |problem| ContextError::Endpoint {
            position: index + 1,
            problem,
        };
        if entry.is_empty() {
            return Err(endpoint("it is empty"));
        }
        let Some(authority) = entry.strip_prefix(SCHEME) else {
            return Err(endpoint("it does not start with https://"));
        };
        if authority.contains('@') {
            return Err(endpoint("it has user information"));
        }
        if authority.contains(['/', '?', '#']) {
            return Err(endpoint("it has a path, a query or a fragment"));
        }
        EndpointSet::new([authority]).map_err(|error| match error {
            lease_client::ConfigError::InvalidEndpoint { problem, .. } => endpoint(problem),
            lease_client::ConfigError::NoEndpoints
            | lease_client::ConfigError::InvalidCredentials { .. } => {
                endpoint("it is not a valid host:port")
            }
        })?;
        if !urls.iter().any(|url| url == entry) {
            urls.push(entry.to_owned());
        }
    }
    Ok(urls)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMESPACE: &str = "tak-os-system";

    fn context(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn valid() -> Vec<(&'static str, &'static str)> {
        vec![
            (GENERATION, "7"),
            (
                ENDPOINTS,
                "https://w1.example:7443, https://10.0.0.2:7443,https://[::1]:1",
            ),
        ]
    }

    #[test]
    fn a_minimal_context_is_an_rwx_volume_and_unknown_keys_are_ignored() {
        let mut pairs = valid();
        pairs.push(("storage.kubernetes.io/csiProvisionerIdentity", "x"));
        pairs.push(("csi.storage.k8s.io/pod.name", "p"));
        let parsed = VolumeContext::parse(&context(&pairs), NAMESPACE).unwrap();
        assert_eq!(parsed.generation, 7);
        assert_eq!(parsed.mode, VolumeMode::Rwx);
        assert_eq!(
            parsed.endpoint_urls,
            [
                "https://w1.example:7443",
                "https://10.0.0.2:7443",
                "https://[::1]:1"
            ]
        );
        assert_eq!(
            parsed.endpoints.iter().collect::<Vec<_>>(),
            ["w1.example:7443", "10.0.0.2:7443", "[::1]:1"]
        );
    }

    #[test]
    fn the_access_mode_and_the_own_namespace_are_accepted() {
        let mut pairs = valid();
        pairs.push((ACCESS_MODE, "rwo"));
        pairs.push((CREDENTIAL_NAMESPACE, NAMESPACE));
        let parsed = VolumeContext::parse(&context(&pairs), NAMESPACE).unwrap();
        assert_eq!(parsed.mode, VolumeMode::Rwo);
    }

    #[test]
    fn every_malformed_value_names_its_key() {
        let cases: &[(&str, &str, &str)] = &[
            (GENERATION, "", "is required"),
            (GENERATION, "-1", "\"-1\" is invalid"),
            (GENERATION, "+1", "\"+1\" is invalid"),
            (GENERATION, "18446744073709551616", "is invalid"),
            (GENERATION, " 1", "is invalid"),
            (ENDPOINTS, "", "is required"),
            (
                ACCESS_MODE,
                "RWO",
                "\"RWO\" is invalid: expected rwx or rwo",
            ),
            (
                CREDENTIAL_NAMESPACE,
                "other",
                "\"other\" is not this driver's",
            ),
        ];
        for (key, value, expected) in cases {
            let mut pairs: Vec<_> = valid().into_iter().filter(|(k, _)| k != key).collect();
            pairs.push((key, value));
            let error = VolumeContext::parse(&context(&pairs), NAMESPACE).unwrap_err();
            let text = error.to_string();
            assert!(text.contains(key), "{key}={value:?}: {text}");
            assert!(text.contains(expected), "{key}={value:?}: {text}");
        }
        let error =
            VolumeContext::parse(&context(&[(ENDPOINTS, "https://a:1")]), NAMESPACE).unwrap_err();
        assert_eq!(error, ContextError::Missing { key: GENERATION });
    }

    #[test]
    fn a_refused_endpoint_is_named_by_position_and_never_quoted() {
        for (bad, problem) in [
            ("https://user:hunter2@w.example:1", "user information"),
            ("http://w.example:1", "https://"),
            ("https://w.example:1/p", "a path"),
            ("https://w.example:1?token=hunter2", "a query"),
            ("https://w.example:1#hunter2", "a fragment"),
            ("https://w.example", "no port"),
            ("https://:1", "no host"),
            ("hunter2", "https://"),
            ("", "empty"),
        ] {
            let list = format!("https://ok.example:1,{bad}");
            let pairs = [(GENERATION, "1"), (ENDPOINTS, list.as_str())];
            let error = VolumeContext::parse(&context(&pairs), NAMESPACE).unwrap_err();
            let text = format!("{error} {error:?}");
            assert!(
                matches!(error, ContextError::Endpoint { position: 2, .. }),
                "{bad:?}: {error:?}"
            );
            assert!(text.contains(problem), "{bad:?}: {text}");
            assert!(!text.contains("hunter2"), "{bad:?} leaked: {text}");
        }
        let many = vec!["https://w.example:1"; MAX_ENDPOINTS + 1].join(",");
        let error = VolumeContext::parse(
            &context(&[(GENERATION, "1"), (ENDPOINTS, &many)]),
            NAMESPACE,
        )
        .unwrap_err();
        assert_eq!(error, ContextError::TooManyEndpoints { count: 17 });
    }
}
