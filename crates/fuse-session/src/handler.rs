//! What a filesystem implements ([`Handler`]), what it gets with each request
//! ([`RequestContext`]) and what it answers ([`Reply`]).

use std::borrow::Cow;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use fuse_wire::{Errno, Opcode, Request, Unique, reply};
use tokio::sync::Notify;

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
    interrupt: Arc<Interrupt>,
}

/// One request's interrupt: set at most once, by the session, and never cleared.
///
/// Made and dropped for every request, so it is small: a flag and the waiters of
/// [`RequestContext::interrupted`]. Dropping it wakes nobody.
#[derive(Debug, Default)]
struct Interrupt {
    set: AtomicBool,
    waiters: Notify,
}

/// The session's side of a [`RequestContext`]: what an INTERRUPT request sets.
#[derive(Debug)]
pub(crate) struct InterruptSwitch(Arc<Interrupt>);

impl InterruptSwitch {
    /// Interrupts the request: its context says so from now on, and whoever waits in
    /// [`RequestContext::interrupted`] wakes.
    pub(crate) fn interrupt(&self) {
        self.0.set.store(true, Ordering::Release);
        self.0.waiters.notify_waiters();
    }
}

impl RequestContext {
    /// A context and the switch that interrupts it.
    pub(crate) fn new() -> (RequestContext, InterruptSwitch) {
        let interrupt = Arc::new(Interrupt::default());
        (
            RequestContext {
                interrupt: Arc::clone(&interrupt),
            },
            InterruptSwitch(interrupt),
        )
    }

    /// A context that is never interrupted, for calling a handler outside a session (tests).
    pub fn never_interrupted() -> RequestContext {
        RequestContext::new().0
    }

    /// Whether the kernel has asked to interrupt the request.
    pub fn is_interrupted(&self) -> bool {
        self.interrupt.set.load(Ordering::Acquire)
    }

    /// Resolves once the kernel asks to interrupt the request; never, if it does not (as
    /// after the request is over, or for a context made outside a session).
    pub async fn interrupted(&self) {
        loop {
            // Registered before the flag is read: a switch thrown in between still wakes it.
            let mut woken = pin!(self.interrupt.waiters.notified());
            woken.as_mut().enable();
            if self.is_interrupted() {
                return;
            }
            woken.await;
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
        let waiting: Vec<_> = (0..2)
            .map(|_| {
                let context = context.clone();
                tokio::spawn(async move { context.interrupted().await })
            })
            .collect();
        // Let the waiters start waiting before the switch is thrown.
        tokio::task::yield_now().await;
        interrupt.interrupt();
        for waiter in waiting {
            tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
                .await
                .expect("every waiter wakes")
                .unwrap();
        }
        assert!(context.is_interrupted());
        // Once thrown, the switch stays: a later wait returns at once.
        tokio::time::timeout(std::time::Duration::from_secs(5), context.interrupted())
            .await
            .expect("an interrupted context resolves at once");

        let never = RequestContext::never_interrupted();
        let waited =
            tokio::time::timeout(std::time::Duration::from_millis(20), never.interrupted()).await;
        assert!(
            waited.is_err(),
            "a context outside a session is never interrupted"
        );
    }

    /// The switch thrown from another thread while the waiter registers, many times over: no
    /// wake-up is lost between the waiter's registration and its look at the flag. A race
    /// test catches a wrong order only by chance (it did, in round 72 of one run, with a
    /// thread yield put between the look and the registration); tokio's documented
    /// guarantee, that a `Notified` made before `notify_waiters` is woken by it, is the
    /// proof.
    #[test]
    fn an_interrupt_racing_the_wait_is_never_lost() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap();
        for round in 0..2000 {
            let (context, interrupt) = RequestContext::new();
            let waiter = rt.spawn(async move { context.interrupted().await });
            interrupt.interrupt();
            let finished = rt.block_on(async {
                tokio::time::timeout(std::time::Duration::from_secs(5), waiter).await
            });
            assert!(
                matches!(finished, Ok(Ok(()))),
                "round {round}: the waiter missed its interrupt"
            );
        }
    }
}
