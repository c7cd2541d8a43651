//! What a filesystem implements ([`Handler`]), what it gets with each request
//! ([`RequestContext`]) and what it answers ([`Reply`]).

use std::borrow::Cow;
use std::future::Future;

use bytes::Bytes;
use fuse_wire::{Errno, Opcode, Request, Unique, reply};
use tokio::sync::watch;

/// A filesystem behind a [`Session`](crate::Session).
///
/// The session calls [`handle`](Self::handle) for every request it does not answer itself,
/// each on its own tokio task, with the request decoded from the session's own copy of the
/// bytes. The session answers these itself and never passes them on: INIT (at mount),
/// DESTROY (an empty reply), INTERRUPT (it signals the request's [`RequestContext`]), and
/// every opcode `fuse_wire` does not decode (`ENOSYS`; the kernel then stops sending most of
/// them, and answers callers with `EOPNOTSUPP` or a fallback).
///
/// FORGET and BATCH_FORGET are passed on (the handler keeps the lookup counts) and get no
/// reply, whatever the handler returns: return [`Reply::none`].
///
/// Every other request needs exactly one reply carrying its `unique` as received. A reply
/// that is missing, or names another `unique`, is replaced by `EIO` (and logged), and so is a
/// handler that panics: the kernel's caller never waits forever on the handler's account.
pub trait Handler: Send + Sync + 'static {
    /// Handles one request. `request` borrows the session's copy of the bytes for as long as
    /// the returned future lives.
    fn handle<'a>(
        &'a self,
        context: RequestContext,
        request: Request<'a>,
    ) -> impl Future<Output = Reply> + Send + 'a;

    /// Called once the reply to request `unique` (an `opcode` request) was written to the
    /// kernel: `delivered` is true when the kernel took it, false when it refused it (the
    /// request was no longer waited for, or the connection had ended) or when the handler's
    /// reply was replaced by `EIO`. For requests that hand the kernel something it must later
    /// give back (an open handle), so that the handler knows the kernel holds it. Not called
    /// for requests that get no reply. Does nothing unless implemented.
    fn replied(&self, unique: Unique, opcode: Opcode, delivered: bool) {
        let _ = (unique, opcode, delivered);
    }
}

/// What a handler learns about its request besides the request itself: whether the kernel
/// asked to interrupt it (the caller got a signal).
///
/// An interrupted request still needs a reply; `EINTR` is the usual one. A request resent
/// after `FUSE_NOTIFY_RESEND` (its `unique` has [`Unique::RESEND_BIT`]) is answered like any
/// other.
#[derive(Debug, Clone)]
pub struct RequestContext {
    interrupt: watch::Receiver<bool>,
}

impl RequestContext {
    /// A context and the switch that interrupts it.
    pub(crate) fn new() -> (RequestContext, watch::Sender<bool>) {
        let (tx, rx) = watch::channel(false);
        (RequestContext { interrupt: rx }, tx)
    }

    /// A context that is never interrupted, for calling a handler outside a session (tests).
    pub fn never_interrupted() -> RequestContext {
        RequestContext::new().0
    }

    /// Whether the kernel has asked to interrupt the request.
    pub fn is_interrupted(&self) -> bool {
        *self.interrupt.borrow()
    }

    /// Resolves once the kernel asks to interrupt the request; never, if it does not.
    pub async fn interrupted(&self) {
        let mut interrupt = self.interrupt.clone();
        if interrupt
            .wait_for(|&interrupted| interrupted)
            .await
            .is_err()
        {
            // The request is over (or the context was made outside a session): no
            // interrupt can come any more.
            std::future::pending::<()>().await;
        }
    }
}

/// A handler's answer: one whole message encoded with [`fuse_wire::reply`], a header and a
/// body written together without copying the body ([`Reply::bytes`]), or nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reply {
    /// The whole message, or the header of one whose body is `body`.
    message: Option<Vec<u8>>,
    body: Option<Bytes>,
}

impl Reply {
    /// No reply: for FORGET and BATCH_FORGET, the only requests that get none.
    pub fn none() -> Reply {
        Reply::default()
    }

    /// An error reply.
    pub fn error(unique: Unique, errno: Errno) -> Reply {
        Reply::encode(|out| reply::error(out, unique, errno))
    }

    /// A successful reply without a body.
    pub fn empty(unique: Unique) -> Reply {
        Reply::encode(|out| reply::empty(out, unique))
    }

    /// A reply whose body is bytes (READ, READLINK, READDIR, READDIRPLUS); `EIO` if it is too
    /// long for a message.
    pub fn data(unique: Unique, data: &[u8]) -> Reply {
        let mut out = Vec::with_capacity(fuse_wire::OUT_HEADER_SIZE + data.len());
        match reply::data(&mut out, unique, data) {
            Ok(()) => Reply::from_message(out),
            Err(_) => Reply::error(unique, Errno::EIO),
        }
    }

    /// [`Reply::data`] without copying: the session writes the header and `data` with one
    /// `writev`. For large bodies (READ): a copy into a new buffer per reply costs an
    /// allocation whose pages the allocator may have given back, so fresh page faults, on
    /// every read.
    pub fn bytes(unique: Unique, data: Bytes) -> Reply {
        match reply::header(unique, data.len()) {
            Ok(header) => Reply {
                message: Some(header.to_vec()),
                body: Some(data),
            },
            Err(_) => Reply::error(unique, Errno::EIO),
        }
    }

    /// A reply built by one of [`fuse_wire::reply`]'s functions:
    /// `Reply::encode(|out| reply::entry(out, unique, &entry))`.
    pub fn encode(build: impl FnOnce(&mut Vec<u8>)) -> Reply {
        let mut out = Vec::new();
        build(&mut out);
        Reply::from_message(out)
    }

    /// A reply from bytes already encoded (a `fuse_out_header` and its body).
    pub fn from_message(message: Vec<u8>) -> Reply {
        Reply {
            message: Some(message),
            body: None,
        }
    }

    /// The whole message (a [`Reply::bytes`] reply's header and body joined into a copy), or
    /// `None` for no reply.
    pub fn message(&self) -> Option<Cow<'_, [u8]>> {
        let message = self.message.as_deref()?;
        Some(match &self.body {
            None => Cow::Borrowed(message),
            Some(body) => Cow::Owned([message, body].concat()),
        })
    }

    /// The message (or the header), and the body written after it, if any.
    pub(crate) fn into_parts(self) -> Option<(Vec<u8>, Option<Bytes>)> {
        Some((self.message?, self.body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_carry_the_unique_as_received() {
        let unique = Unique(Unique::RESEND_BIT | 42);
        let error = Reply::error(unique, Errno::ENOENT);
        let (header, body) = reply::decode(&error.message().unwrap())
            .map(|(h, b)| (h, b.to_vec()))
            .unwrap();
        assert_eq!((header.unique, header.error), (unique.raw(), -2));
        assert!(body.is_empty());
        let data = Reply::data(unique, b"abc");
        let message = data.message().unwrap();
        let (header, body) = reply::decode(&message).unwrap();
        assert_eq!(
            (header.unique, header.error, body),
            (unique.raw(), 0, &b"abc"[..])
        );
        let vectored = Reply::bytes(unique, Bytes::from_static(b"abc"));
        assert_eq!(
            vectored.message(),
            data.message(),
            "the same bytes on the wire"
        );
        assert_eq!(Reply::none().message(), None);
        assert_eq!(
            Reply::empty(unique),
            Reply::from_message(Reply::empty(unique).message().unwrap().to_vec())
        );
    }

    #[tokio::test]
    async fn a_context_learns_of_its_interrupt() {
        let (context, interrupt) = RequestContext::new();
        assert!(!context.is_interrupted());
        let waiting = tokio::spawn({
            let context = context.clone();
            async move { context.interrupted().await }
        });
        interrupt.send_replace(true);
        waiting.await.unwrap();
        assert!(context.is_interrupted());

        let never = RequestContext::never_interrupted();
        let waited =
            tokio::time::timeout(std::time::Duration::from_millis(20), never.interrupted()).await;
        assert!(
            waited.is_err(),
            "a context outside a session is never interrupted"
        );
    }
}
