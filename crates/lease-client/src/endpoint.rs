//! The fixed set of worker endpoints a volume was staged with.

use std::fmt;
use std::str::FromStr;

use http::uri::Authority;

use crate::ConfigError;

/// The worker endpoints of one volume, as `host:port`, in the order they were staged.
///
/// The set never changes after staging: a worker's hint can select one of its members but
/// never add one.
#[derive(Clone, PartialEq, Eq)]
pub struct EndpointSet {
    endpoints: Vec<Authority>,
}

impl EndpointSet {
    /// Validates `host:port` endpoints (a host name, an IPv4 address or a bracketed IPv6
    /// address, and a port). Duplicates are dropped; the set must not be empty.
    pub fn new<I, S>(endpoints: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut parsed: Vec<Authority> = Vec::new();
        for (index, endpoint) in endpoints.into_iter().enumerate() {
            let authority =
                parse(endpoint.as_ref()).map_err(|problem| ConfigError::InvalidEndpoint {
                    position: index + 1,
                    problem,
                })?;
            if !parsed.contains(&authority) {
                parsed.push(authority);
            }
        }
        if parsed.is_empty() {
            return Err(ConfigError::NoEndpoints);
        }
        Ok(EndpointSet { endpoints: parsed })
    }

    /// How many endpoints there are (at least one).
    pub fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// Always false: a set holds at least one endpoint.
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// The endpoint at `index`, wrapping around.
    pub fn get(&self, index: usize) -> &str {
        self.endpoints[index % self.endpoints.len()].as_str()
    }

    /// The index of `endpoint` if it is a member, compared as `http` compares authorities
    /// (host names case-insensitively).
    pub fn position(&self, endpoint: &str) -> Option<usize> {
        let authority = Authority::from_str(endpoint).ok()?;
        self.endpoints
            .iter()
            .position(|member| *member == authority)
    }

    /// The endpoints in staging order.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.endpoints.iter().map(Authority::as_str)
    }
}

/// One `host:port` endpoint, or what is wrong with it.
fn parse(endpoint: &str) -> Result<Authority, &'static str> {
    if endpoint.contains('@') {
        return Err("it has user information; expected host:port");
    }
    if endpoint.contains('/') {
        return Err("it has a scheme or a path; expected host:port");
    }
    let authority = Authority::from_str(endpoint).map_err(|_| "it is not a valid host:port")?;
    if authority.host().is_empty() {
        return Err("it has no host; expected host:port");
    }
    if authority.port_u16().is_none() {
        return Err("it has no port; expected host:port");
    }
    Ok(authority)
}

impl fmt::Debug for EndpointSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_host_and_port() {
        let set = EndpointSet::new([
            "a.example:443",
            "127.0.0.1:8443",
            "[::1]:1",
            "a.example:443",
        ])
        .unwrap();
        assert_eq!(set.len(), 3);
        assert_eq!(set.position("A.EXAMPLE:443"), Some(0));
        assert_eq!(set.position("[::1]:1"), Some(2));
        assert_eq!(set.position("a.example:444"), None);
        assert_eq!(set.position("not an endpoint"), None);
        assert_eq!(set.get(4), "127.0.0.1:8443");
        for (bad, problem) in [
            ("a.example", "no port"),
            ("", "not a valid host:port"),
            (":443", "no host"),
            ("user:secret@a.example:443", "user information"),
            ("a b:1", "not a valid host:port"),
            ("https://a:1", "a scheme or a path"),
            ("a:1/p", "a scheme or a path"),
        ] {
            let error = EndpointSet::new(["a.example:1", bad]).unwrap_err();
            let text = error.to_string();
            assert!(
                matches!(error, ConfigError::InvalidEndpoint { position: 2, .. }),
                "{bad:?}: {error:?}"
            );
            assert!(text.contains(problem), "{bad:?}: {text}");
            if !bad.is_empty() {
                assert!(!text.contains(bad), "{bad:?} is quoted in {text:?}");
            }
        }
        let error = EndpointSet::new(["user:secret@a.example:443"]).unwrap_err();
        assert!(!format!("{error:?}").contains("secret"), "{error:?}");
        assert!(matches!(
            EndpointSet::new(Vec::<String>::new()),
            Err(ConfigError::NoEndpoints)
        ));
    }
}
