//! The narrow seam between the filesystem and the worker protocol.

use std::future::Future;
use std::time::Instant;

use lease_client::protocol::RequestId;
use lease_client::v1::reply::Result as ReplyResult;
use lease_client::v1::request::Op;
use lease_client::{Client, Transport};

/// Sends one operation to the volume's workers and returns its result.
///
/// [`lease_client::Client`] is the real one (it attaches the volume identity, the request ID and
/// the mount epoch, and applies the call budget, retries and admission). Tests pass an
/// in-process worker or a fake.
pub trait FileService: Send + Sync + 'static {
    /// Performs `op` as one logical call under `request_id`: the ID derived from the kernel
    /// request the call is made for ([`crate::ConnectionNonce::request_id`]), or `None` for
    /// a call made for no kernel request (handle renewal), which gets a fresh random ID. No
    /// attempt starts after `until` when it is given (a resent mutation's deadline D), nor
    /// after the call budget. A successful result is never [`ReplyResult::Error`]: refusals
    /// come back as [`lease_client::Error::Refused`].
    fn call(
        &self,
        request_id: Option<RequestId>,
        until: Option<Instant>,
        op: Op,
    ) -> impl Future<Output = Result<ReplyResult, lease_client::Error>> + Send;
}

impl<T: Transport> FileService for Client<T> {
    async fn call(
        &self,
        request_id: Option<RequestId>,
        until: Option<Instant>,
        op: Op,
    ) -> Result<ReplyResult, lease_client::Error> {
        let call = match request_id {
            Some(id) => self.prepare_with_id(id, op)?,
            None => self.prepare(op)?,
        };
        match until {
            Some(until) => self.send_until(&call, until).await,
            None => self.send(&call).await,
        }
    }
}
