//! A FUSE session of the project's own over `/dev/fuse`: it mounts and runs INIT, serves
//! requests with an async [`Handler`], can **pause** (stop reading at any moment and hand back
//! the live descriptor with its [`InitRecord`]), and can **adopt** a live, already initialized
//! descriptor (from a paused session or another process) and serve it without a second INIT.
//! It never unmounts, and never sends anything, on drop.
//!
//! [`InitRecord`]: fuse_wire::InitRecord
//!
//! It exists so that a mount owner can hand its FUSE connections to a successor: a connection
//! lives as long as any copy of its descriptor is open, so an owner deposits a copy with a
//! keeper (`fdpass`), and a successor adopts it (`bins/tak-os-node/HANDOFF.md`).
//!
//! - [`Session::mount`]: `/dev/fuse`, mount(2) with `fd=N,rootmode=…,user_id=…,group_id=…`
//!   (privileged, no `fusermount`), INIT answered by [`negotiate()`], which names every flag
//!   agreed to and every one left out.
//! - [`Session::adopt`] / [`Session::adopt_encoded`]: a descriptor and its record; checked
//!   (it must be `/dev/fuse`, the record must decode) before anything is changed, and given
//!   back on refusal.
//! - [`Session::pause`]: stops reading, waits until every request read has been answered
//!   (bounded by a deadline; past it the session serves again and comes back in the error),
//!   and returns [`Paused`] without unmounting.
//! - [`notify_resend`]: `FUSE_NOTIFY_RESEND`, so requests a dead holder had read come again
//!   (with the resend bit) to the next reader.
//! - [`Session::wait`]: ends when the kernel reports the connection gone (`ENODEV`).
//!
//! The reader reads with non-blocking reads as tokio's reactor reports the descriptor
//! readable, into a buffer of the record's
//! [`read_buffer_size`](fuse_wire::InitRecord::read_buffer_size), and polls each request's
//! handler once itself (at most [`ServeOptions::max_in_flight`] requests at once): a request
//! answered at once is answered in the reader's turn; one that has to wait goes on as a tokio
//! task of its own, which writes the reply, while the reader reads on. INIT, DESTROY,
//! INTERRUPT and opcodes `fuse_wire` does not decode (`ENOSYS`) are answered by the session;
//! FORGET and BATCH_FORGET go to the handler and get no reply.
//!
//! **`O_NONBLOCK`** is a flag of the open file description, so setting it on one descriptor
//! sets it for every copy in every process. Every holder in this design tolerates that: a
//! keeper never reads, and every session reads with readiness and non-blocking reads. A
//! session sets it at open (fresh) or at adoption (if it is not set yet).
//!
//! What it does not do (yet): splice, FUSE over io_uring, the writeback cache, passthrough,
//! `FUSE_DEV_IOC_CLONE`d devices (owners read through `SCM_RIGHTS` copies only), unmounting
//! (the caller unmounts, after an identity check). `fusefs` mounts and serves with it.
//!
//! ```
//! use fuse_session::{Handler, Reply, RequestContext};
//! use fuse_wire::{Attr, AttrOut, Errno, Operation, Request, reply};
//!
//! /// An empty, read-only root directory.
//! struct Empty;
//!
//! impl Handler for Empty {
//!     async fn handle<'a>(&'a self, _context: RequestContext, request: Request<'a>) -> Reply {
//!         let unique = request.header.unique;
//!         match request.op {
//!             Operation::Getattr(_) if request.header.nodeid == fuse_wire::ROOT_ID => {
//!                 let attr = Attr { ino: 1, mode: 0o040_555, nlink: 2, ..Attr::default() };
//!                 let out = AttrOut { attr, ..AttrOut::default() };
//!                 Reply::encode(|buf| reply::attr(buf, unique, &out))
//!             }
//!             Operation::Forget(_) | Operation::BatchForget(_) => Reply::none(),
//!             _ => Reply::error(unique, Errno::ENOENT),
//!         }
//!     }
//! }
//!
//! async fn serve(target: &std::path::Path) -> Result<(), fuse_session::Error> {
//!     let options = fuse_session::MountOptions::new("example");
//!     let session = fuse_session::Session::mount(target, &options, Empty).await?;
//!     assert!(session.record().max_write() >= 4096);
//!     session.wait().await // until someone unmounts it
//! }
//!
//! // The handler is plain code; call it without a mount.
//! # let rt = tokio::runtime::Builder::new_current_thread().build()?;
//! let mut bytes = Vec::new();
//! let unique = fuse_wire::Unique(2);
//! let header = fuse_wire::InHeader { unique, nodeid: 1, ..Default::default() };
//! Request {
//!     header,
//!     op: Operation::Getattr(Default::default()),
//!     extensions: &[],
//! }
//! .encode(&mut bytes)?;
//! let request = Request::decode(&bytes)?;
//! let answer = rt.block_on(Empty.handle(RequestContext::never_interrupted(), request));
//! let message = answer.message().unwrap();
//! let (header, body) = reply::decode(&message)?;
//! assert_eq!((header.error, header.unique, body.len()), (0, 2, 104));
//! # let _ = serve;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

mod device;
mod error;
mod handler;
mod negotiate;
mod options;
mod session;
mod sys;

pub use device::{DEV_FUSE, notify_resend};
pub use error::{AdoptError, Error, PauseError};
pub use handler::{Handler, Reply, RequestContext};
pub use negotiate::{AGREED, negotiate};
pub use options::{
    DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_WRITE, MAX_MAX_IN_FLIGHT, MAX_MAX_WRITE, MIN_MAX_WRITE,
    MountOptions, ServeOptions,
};
pub use session::{Counters, Paused, Session};
