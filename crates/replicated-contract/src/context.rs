//! The volume context contract: what whoever creates replicated volumes (the manager, or the
//! reference controller) hands the node in `volume_context`. The creator builds it with
//! [`VolumeContext::new`] and writes it with [`VolumeContext::to_map`]; the node validates it
//! with [`VolumeContext::parse`].
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
//! a credential, so it is named by its position only. `parse(to_map(new(…)))` gives back what
//! `new` made.

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

    /// Parses `rwx` or `rwo` (exact, lowercase).
    pub fn parse(text: &str) -> Option<Self> {
        [VolumeMode::Rwx, VolumeMode::Rwo]
            .into_iter()
            .find(|mode| mode.as_str() == text)
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
    /// A context for a new volume; the endpoints are checked exactly as `parse` checks them
    /// (same errors): each is trimmed, at most [`MAX_ENDPOINTS`] are allowed, and repeats are
    /// dropped, the first kept; none at all is [`ContextError::Missing`], as an empty list is to
    /// `parse`. An endpoint containing a comma is refused as well, as it could not be written
    /// as one entry of the list.
    pub fn new(
        generation: u64,
        endpoint_urls: &[String],
        mode: VolumeMode,
    ) -> Result<Self, ContextError> {
        let endpoint_urls = check_endpoints(endpoint_urls.iter().map(String::as_str))?;
        let endpoints = endpoint_set(&endpoint_urls)?;
        Ok(VolumeContext {
            generation,
            endpoint_urls,
            endpoints,
            mode,
        })
    }

    /// The `volume_context` map a creator returns: generation, endpoints (comma-separated, in
    /// order), access mode, and the credential namespace when given (an empty one is not
    /// written: `parse` reads an empty value as an absent one).
    pub fn to_map(&self, credential_namespace: Option<&str>) -> HashMap<String, String> {
        let mut map = HashMap::from([
            (GENERATION.to_owned(), self.generation.to_string()),
            (ENDPOINTS.to_owned(), self.endpoint_urls.join(",")),
            (ACCESS_MODE.to_owned(), self.mode.as_str().to_owned()),
        ]);
        if let Some(namespace) = credential_namespace.filter(|n| !n.is_empty()) {
            map.insert(CREDENTIAL_NAMESPACE.to_owned(), namespace.to_owned());
        }
        map
    }

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
        let endpoint_urls = check_endpoints(endpoints.split(','))?;
        let endpoints = endpoint_set(&endpoint_urls)?;
        let mode = match value(ACCESS_MODE) {
            None => VolumeMode::Rwx,
            Some(text) => VolumeMode::parse(text).ok_or_else(|| ContextError::Malformed {
                key: ACCESS_MODE,
                value: text.to_owned(),
                expected: "rwx or rwo",
            })?,
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

/// Checks the entries of the endpoint list, each trimmed; repeats are dropped, the first kept.
fn check_endpoints<'a>(
    entries: impl Iterator<Item = &'a str>,
) -> Result<Vec<String>, ContextError> {
    let entries: Vec<&str> = entries.map(str::trim).collect();
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
        // Never true of an entry split from the list; `new` takes entries one by one.
        if entry.contains(',') {
            return Err(endpoint("it contains a comma"));
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

/// The endpoints of `urls`, each checked by [`check_endpoints`], as `host:port`.
fn endpoint_set(urls: &[String]) -> Result<EndpointSet, ContextError> {
    // Every entry was checked on its own; the set of them is refused only when it is empty.
    EndpointSet::new(urls.iter().map(|url| &url[SCHEME.len()..]))
        .map_err(|_| ContextError::Missing { key: ENDPOINTS })
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

    /// Refused endpoints, each with a part of its problem; none may ever be quoted.
    const BAD_ENDPOINTS: &[(&str, &str)] = &[
        ("https://user:hunter2@w.example:1", "user information"),
        ("http://w.example:1", "https://"),
        ("https://w.example:1/p", "a path"),
        ("https://w.example:1?token=hunter2", "a query"),
        ("https://w.example:1#hunter2", "a fragment"),
        ("https://w.example", "no port"),
        ("https://:1", "no host"),
        ("hunter2", "https://"),
        ("", "empty"),
    ];

    #[test]
    fn a_refused_endpoint_is_named_by_position_and_never_quoted() {
        for &(bad, problem) in BAD_ENDPOINTS {
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

    fn urls(list: &[&str]) -> Vec<String> {
        list.iter().map(|url| (*url).to_owned()).collect()
    }

    #[test]
    fn new_and_to_map_round_trip_through_parse_for_both_modes_with_and_without_a_namespace() {
        let endpoints = urls(&[
            "https://w1.example:7443",
            "https://10.0.0.2:7443",
            "https://[::1]:1",
        ]);
        for mode in [VolumeMode::Rwx, VolumeMode::Rwo] {
            for namespace in [None, Some(NAMESPACE)] {
                let created = VolumeContext::new(u64::MAX, &endpoints, mode).unwrap();
                assert_eq!(created.endpoint_urls, endpoints);
                let map = created.to_map(namespace);
                assert_eq!(map[GENERATION], "18446744073709551615");
                assert_eq!(
                    map[ENDPOINTS],
                    "https://w1.example:7443,https://10.0.0.2:7443,https://[::1]:1"
                );
                assert_eq!(map[ACCESS_MODE], mode.as_str());
                assert_eq!(
                    map.get(CREDENTIAL_NAMESPACE).map(String::as_str),
                    namespace,
                    "{mode} {namespace:?}"
                );
                assert_eq!(map.len(), 3 + usize::from(namespace.is_some()));
                let parsed = VolumeContext::parse(&map, NAMESPACE).unwrap();
                assert_eq!(parsed, created, "{mode} {namespace:?}");
            }
        }
    }

    #[test]
    fn an_empty_namespace_is_not_written() {
        let created =
            VolumeContext::new(1, &urls(&["https://w.example:1"]), VolumeMode::Rwx).unwrap();
        assert!(!created.to_map(Some("")).contains_key(CREDENTIAL_NAMESPACE));
    }

    #[test]
    fn new_trims_and_drops_repeats_as_parse_does() {
        let list = [
            " https://a.example:1",
            "https://b.example:2 ",
            "https://a.example:1",
        ];
        let created = VolumeContext::new(3, &urls(&list), VolumeMode::Rwo).unwrap();
        let map = HashMap::from([
            (GENERATION.to_owned(), "3".to_owned()),
            (ENDPOINTS.to_owned(), list.join(",")),
            (ACCESS_MODE.to_owned(), "rwo".to_owned()),
        ]);
        assert_eq!(created, VolumeContext::parse(&map, NAMESPACE).unwrap());
        assert_eq!(
            created.endpoint_urls,
            ["https://a.example:1", "https://b.example:2"]
        );
        assert_eq!(
            VolumeContext::parse(&created.to_map(None), NAMESPACE).unwrap(),
            created
        );
    }

    #[test]
    fn new_refuses_a_bad_endpoint_with_the_error_of_parse_and_never_quotes_it() {
        let parse_error = |list: &str| {
            let map = HashMap::from([
                (GENERATION.to_owned(), "1".to_owned()),
                (ENDPOINTS.to_owned(), list.to_owned()),
            ]);
            VolumeContext::parse(&map, NAMESPACE).unwrap_err()
        };
        for &(bad, problem) in BAD_ENDPOINTS {
            let list = ["https://ok.example:1", bad];
            let error = VolumeContext::new(1, &urls(&list), VolumeMode::Rwx).unwrap_err();
            assert_eq!(error, parse_error(&list.join(",")), "{bad:?}");
            assert!(
                matches!(error, ContextError::Endpoint { position: 2, .. }),
                "{bad:?}: {error:?}"
            );
            let text = format!("{error} {error:?}");
            assert!(text.contains(problem), "{bad:?}: {text}");
            assert!(!text.contains("hunter2"), "{bad:?} leaked: {text}");
        }
        // An entry that would become two entries of the list.
        let error = VolumeContext::new(
            1,
            &urls(&["https://ok.example:1", "https://hunter2,w.example:1"]),
            VolumeMode::Rwx,
        )
        .unwrap_err();
        assert!(
            matches!(error, ContextError::Endpoint { position: 2, problem } if problem.contains("comma")),
            "{error:?}"
        );
        assert!(!format!("{error} {error:?}").contains("hunter2"));

        let many = vec!["https://w.example:1".to_owned(); MAX_ENDPOINTS + 1];
        let error = VolumeContext::new(1, &many, VolumeMode::Rwx).unwrap_err();
        assert_eq!(error, parse_error(&many.join(",")));
        assert_eq!(error, ContextError::TooManyEndpoints { count: 17 });
        assert_eq!(
            VolumeContext::new(1, &[], VolumeMode::Rwx).unwrap_err(),
            parse_error("")
        );
    }

    #[test]
    fn volume_mode_parse_takes_only_the_exact_lowercase_names() {
        for mode in [VolumeMode::Rwx, VolumeMode::Rwo] {
            assert_eq!(VolumeMode::parse(mode.as_str()), Some(mode));
        }
        for text in ["RWO", " rwo", "rwo ", "Rwx", "", "rw", "rwxo"] {
            assert_eq!(VolumeMode::parse(text), None, "{text:?}");
        }
    }
}
