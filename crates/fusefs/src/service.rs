//! The narrow seam between the filesystem and the worker protocol.

use std::future::Future;

use lease_client::v1::reply::Result as ReplyResult;
use lease_client::v1::request::Op;
use lease_client::{Client, Transport};

/// Sends one operation to the volume's workers and returns its result.
///
/// [`lease_client::Client`] is the real one (it attaches the volume identity, the request ID and
/// the mount epoch, and applies the call budget, retries and admission). Tests pass an
/// in-process worker or a fake.
pub trait FileService: Send + Sync + 'static {
    /// Performs `op` as one logical call. A successful result is never
    /// [`ReplyResult::Error`]: refusals come back as [`lease_client::Error::Refused`].
    fn call(&self, op: Op)
    -> impl Future<Output = Result<ReplyResult, lease_client::Error>> + Send;
}

impl<T: Transport> FileService for Client<T> {
    fn call(
        &self,
        op: Op,
    ) -> impl Future<Output = Result<ReplyResult, lease_client::Error>> + Send {
        Client::call(self, op)
    }
}
