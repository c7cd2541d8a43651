//! Watching the worker calls made for kernel requests: what a test needs to prove that a
//! request served by several owners of its connection made each of its calls under one
//! request ID, and what a tracer needs to follow a request to the workers.

use std::fmt;
use std::sync::Arc;

use lease_client::protocol::RequestId;

use super::{ConnectionNonce, Fs};
use crate::service::FileService;

/// One worker call made for a kernel request, before it is sent and again after its outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObservedCall {
    /// The connection's nonce.
    pub nonce: ConnectionNonce,
    /// The kernel request's ID, without its resend and interrupt bits.
    pub unique: u64,
    /// Whether the kernel had resent the request.
    pub resent: bool,
    /// The call's index in the request's sequence.
    pub index: u32,
    /// The request ID the call was sent under.
    pub request_id: RequestId,
    /// The operation's name.
    pub op: &'static str,
    /// Whether the operation changes the volume.
    pub mutation: bool,
    /// `None` before the call is sent; then whether the workers answered it with a result
    /// (not an error, and not no answer).
    pub succeeded: Option<bool>,
}

/// Told of every worker call made for a kernel request ([`Fs::observe_calls`]), twice: as it
/// is about to be sent (so that a call whose sender dies is known too) and with its outcome.
/// Calls made for no kernel request (handle renewals, releases of handles nobody holds) are
/// not told. Called on the request's task: keep it short.
pub trait CallObserver: Send + Sync + fmt::Debug + 'static {
    /// One call, before it is sent or with its outcome.
    fn observed(&self, call: &ObservedCall);
}

impl<S: FileService> Fs<S> {
    /// From now on, tells `observer` of every worker call made for a kernel request. Set
    /// once; `false` if one was set before.
    pub fn observe_calls(&self, observer: Arc<dyn CallObserver>) -> bool {
        self.observer.set(observer).is_ok()
    }
}
