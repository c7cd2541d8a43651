//! The CSI v1.12 wire contract for TAK-OS storage: messages and gRPC services generated with
//! tonic and prost, plus the Unix-socket plumbing that every CSI driver needs.
//!
//! - [`v1`] holds the `csi.v1` package: the Identity, Controller and Node services (server
//!   traits under `*_server`, clients under `*_client`) and every message they use, with the
//!   specification's names and field numbers, alpha fields included. The code is generated
//!   from `proto/csi.proto` by a pure-Rust compiler (protox) and checked in; a test fails when
//!   regenerating would change it.
//! - [`UnixEndpoint`] parses the `unix:///path` endpoints that kubelet and the sidecars pass.
//! - [`bind_unix`], [`serve_on`] and [`serve_unix`] serve a tonic router on a Unix socket,
//!   replacing a stale socket but never any other kind of file; [`connect_unix`] opens a
//!   client channel to one.
//!
//! What this crate does not do: implement any CSI behaviour, validate requests, map errors
//! to gRPC statuses, or serve TCP. The GroupController and SnapshotMetadata services are not
//! included.
//!
//! # Example
//!
//! ```no_run
//! use csi_proto::v1::identity_client::IdentityClient;
//! use csi_proto::v1::identity_server::{Identity, IdentityServer};
//! use csi_proto::v1::{
//!     GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
//!     GetPluginInfoResponse, ProbeRequest, ProbeResponse,
//! };
//! use tonic::{Request, Response, Status};
//!
//! struct Plugin;
//!
//! #[tonic::async_trait]
//! impl Identity for Plugin {
//!     async fn get_plugin_info(
//!         &self,
//!         _: Request<GetPluginInfoRequest>,
//!     ) -> Result<Response<GetPluginInfoResponse>, Status> {
//!         Ok(Response::new(GetPluginInfoResponse {
//!             name: "csi.example.org".into(),
//!             vendor_version: "0.1.0".into(),
//!             manifest: Default::default(),
//!         }))
//!     }
//!     async fn get_plugin_capabilities(
//!         &self,
//!         _: Request<GetPluginCapabilitiesRequest>,
//!     ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
//!         Ok(Response::new(GetPluginCapabilitiesResponse::default()))
//!     }
//!     async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
//!         Ok(Response::new(ProbeResponse { ready: Some(true) }))
//!     }
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let endpoint = csi_proto::UnixEndpoint::parse("unix:///csi/csi.sock")?;
//! let listener = csi_proto::bind_unix(endpoint.path())?; // clients may connect from here on
//! let router = tonic::transport::Server::builder().add_service(IdentityServer::new(Plugin));
//! let server = tokio::spawn(csi_proto::serve_on(listener, router, std::future::pending()));
//!
//! let mut client = IdentityClient::new(csi_proto::connect_unix(endpoint.path()).await?);
//! let info = client.get_plugin_info(GetPluginInfoRequest {}).await?.into_inner();
//! assert_eq!(info.name, "csi.example.org");
//! # drop(server);
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

mod endpoint;
mod error;
mod socket;

pub use endpoint::{MAX_SOCKET_PATH_LEN, UnixEndpoint};
pub use error::{EndpointProblem, Error, FileKind};
pub use socket::{
    SHUTDOWN_GRACE, bind_unix, connect_unix, connect_unix_lazy, remove_stale_socket, serve_on,
    serve_on_with_grace, serve_unix,
};

/// NodeGetCapabilities' answer: the node service RPC capabilities `types`, in order.
pub fn node_capabilities(
    types: &[v1::node_service_capability::rpc::Type],
) -> v1::NodeGetCapabilitiesResponse {
    use v1::node_service_capability::{Rpc, Type};
    v1::NodeGetCapabilitiesResponse {
        capabilities: types
            .iter()
            .map(|t| v1::NodeServiceCapability {
                r#type: Some(Type::Rpc(Rpc { r#type: *t as i32 })),
            })
            .collect(),
    }
}

/// A bounded name for a gRPC status code, for log fields and metric labels: the code's name
/// in lower case (`ok`, `invalid_argument`, `failed_precondition`).
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

/// The `csi.v1` package, generated from `proto/csi.proto` (see the crate docs).
///
/// Items are named as prost and tonic name them: messages as structs, nested messages and
/// enums in a module named after their parent in snake case, oneofs as enums, and each
/// service `Foo` as `foo_server::{Foo, FooServer}` and `foo_client::FooClient`.
#[rustfmt::skip]
#[allow(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    unused_qualifications,
    rust_2018_idioms,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
    clippy::wildcard_enum_match_arm,
    clippy::unwrap_used,
    clippy::expect_used
)]
pub mod v1 {
    include!("generated/csi.v1.rs");
}
