//! The names of a volume's credentials: the keys of its Secret (`<volumeID>-auth` in the
//! credential namespace) and, in development, the files of its directory
//! (`<credentials-dir>/<volumeID>/<key>`). The creator writes them; the node reads them.

/// The bearer token the node presents to the workers.
pub const TOKEN: &str = "token";
/// The next bearer token during a rotation; while present the node presents it instead.
pub const NEXT_TOKEN: &str = "next-token";
/// The CA bundle the node verifies the workers' certificates with.
pub const CA_BUNDLE: &str = "ca.crt";
/// The node's client certificate chain.
pub const CLIENT_CERTIFICATE: &str = "tls.crt";
/// The client certificate's private key.
pub const CLIENT_KEY: &str = "tls.key";
