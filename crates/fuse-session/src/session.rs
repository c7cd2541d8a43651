//! The session: mounting and INIT, adoption, the read loop and its dispatch, pausing.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Poll;
use std::time::Duration;

use fuse_wire::{
    Errno, InHeader, InitRecord, KERNEL_VERSION, OLDEST_SUPPORTED_MINOR, Opcode, Operation,
    Request, Unique, WireStruct, reply,
};
use futures_util::FutureExt;
use tokio::io::unix::AsyncFd;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError, watch};
use tokio::task::{AbortHandle, JoinHandle};
use tracing::{debug, error, warn};

use crate::handler::{Handler, InterruptSwitch, Reply, RequestContext};
use crate::{AdoptError, Error, MountOptions, PauseError, ServeOptions, device, negotiate, sys};

/// The descriptor, shared by the reader and the request tasks (which write replies on it).
type Device = Arc<AsyncFd<OwnedFd>>;

/// One request's handling, from the handler's call to the reply and the permit's return.
struct Task {
    unique: Unique,
    /// The switch of the handler's [`RequestContext`].
    interrupt: InterruptSwitch,
    future: Pin<Box<dyn Future<Output = ()> + Send>>,
}

/// What the session tells its reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Command {
    /// Read and dispatch.
    Serve,
    /// Stop reading, hold no permit, and wait for the next command.
    Park,
    /// Stop for good.
    Quit,
}

/// How the reader ended on its own.
#[derive(Debug, Clone)]
enum End {
    /// The kernel said the connection is gone.
    Gone,
    /// A read failed otherwise.
    Failed(Arc<io::Error>),
}

/// A live FUSE connection being served: fresh ([`Session::mount`]) or adopted
/// ([`Session::adopt`]).
///
/// One reader task reads requests with non-blocking reads as the descriptor becomes
/// readable, at most [`ServeOptions::max_in_flight`] at once, and runs the [`Handler`] for
/// each. The reader polls the handler's future once itself: a request answered at once (from
/// memory, or refused) is answered in the reader's turn, with no task started; one that has
/// to wait goes on as a task of its own, which writes its reply, while the reader reads on.
/// Reading can stop at any moment ([`pause`](Self::pause)): no read is ever left waiting
/// inside the kernel.
///
/// Dropping a session stops its reader and its request tasks (requests being handled get no
/// reply: they stay with the kernel, for a successor's `FUSE_NOTIFY_RESEND`) and closes its
/// copy of the descriptor. It never unmounts, sends nothing, and never aborts the connection
/// by other means; if its copy was the last one, the kernel aborts the connection (callers
/// get `ENOTCONN`), and the dead mount is the caller's to unmount.
#[derive(Debug)]
pub struct Session {
    device: Device,
    record: InitRecord,
    control: Control,
}

/// A session's descriptor and INIT record, with nothing reading it: what a successor needs to
/// [`Session::adopt`] the connection. The mount is untouched.
#[derive(Debug)]
pub struct Paused {
    /// The descriptor: a copy of the session's, the same open file description (so the same
    /// connection), close-on-exec, with `O_NONBLOCK` set.
    pub fd: OwnedFd,
    /// What the connection negotiated at INIT.
    pub record: InitRecord,
}

/// A session's counts since it started, for logs and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Requests read.
    pub requests: u64,
    /// Requests of an opcode the session does not serve, answered `ENOSYS`.
    pub unsupported: u64,
    /// Requests that did not decode, answered `EIO` when their header was intact.
    pub malformed: u64,
    /// INIT requests read after the connection started, answered `EIO`. The kernel sends INIT
    /// once per connection, so this stays 0; an adopted session proves it.
    pub unexpected_inits: u64,
    /// INTERRUPT requests read.
    pub interrupts: u64,
    /// Handler replies replaced by `EIO`: missing, malformed, naming another request, or the
    /// handler panicked.
    pub replaced_replies: u64,
    /// Replies the kernel refused: mostly `ENOENT` (it no longer waits for that request)
    /// and `ENODEV` (the connection is gone).
    pub failed_writes: u64,
    /// Requests whose handler had to wait (on a worker's answer, say) and went on as a task
    /// of their own. The handler answered the others at once, in the reader's turn.
    pub waited: u64,
}

#[derive(Debug, Default)]
struct Counts {
    requests: AtomicU64,
    unsupported: AtomicU64,
    malformed: AtomicU64,
    unexpected_inits: AtomicU64,
    interrupts: AtomicU64,
    replaced_replies: AtomicU64,
    failed_writes: AtomicU64,
    waited: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Counts {
    fn snapshot(&self) -> Counters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Counters {
            requests: get(&self.requests),
            unsupported: get(&self.unsupported),
            malformed: get(&self.malformed),
            unexpected_inits: get(&self.unexpected_inits),
            interrupts: get(&self.interrupts),
            replaced_replies: get(&self.replaced_replies),
            failed_writes: get(&self.failed_writes),
            waited: get(&self.waited),
        }
    }
}

/// The requests being handled, by raw `unique`: how to interrupt each, and how to stop it.
#[derive(Debug, Default)]
struct InFlight {
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    /// Set when the session is dropped: no task is started any more.
    closed: bool,
    requests: HashMap<u64, Entry>,
}

#[derive(Debug)]
struct Entry {
    interrupt: InterruptSwitch,
    task: AbortHandle,
}

impl InFlight {
    fn lock(&self) -> MutexGuard<'_, Table> {
        // The table stays consistent whatever a panicking holder was doing: every change is
        // one insert or one remove.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn len(&self) -> usize {
        self.lock().requests.len()
    }

    /// Signals the request's context; `false` when it is not being handled (any more).
    fn interrupt(&self, unique: u64) -> bool {
        match self.lock().requests.get(&unique) {
            Some(entry) => {
                entry.interrupt.interrupt();
                true
            }
            None => false,
        }
    }

    fn finish(&self, unique: u64) {
        self.lock().requests.remove(&unique);
    }

    /// Stops every task and refuses new ones.
    fn close(&self) {
        let mut table = self.lock();
        table.closed = true;
        for (_, entry) in table.requests.drain() {
            entry.task.abort();
        }
    }
}

/// The session's side of its reader, and the tasks to stop when the session goes.
#[derive(Debug)]
struct Control {
    command: watch::Sender<Command>,
    ended: watch::Receiver<Option<End>>,
    reader: Option<JoinHandle<()>>,
    in_flight: Arc<InFlight>,
    permits: Arc<Semaphore>,
    max_in_flight: u32,
    counts: Arc<Counts>,
}

impl Drop for Control {
    fn drop(&mut self) {
        self.command.send_replace(Command::Quit);
        if let Some(reader) = self.reader.take() {
            reader.abort();
        }
        self.in_flight.close();
    }
}

impl Session {
    /// Mounts a fresh FUSE filesystem at `target` and starts serving it with `handler`.
    ///
    /// Opens `/dev/fuse` (`O_RDWR | O_CLOEXEC | O_NONBLOCK`), calls mount(2) with
    /// [`MountOptions::mount_data`] (a privileged mount: the caller is root; no `fusermount`),
    /// reads the kernel's INIT, answers it as [`negotiate`](crate::negotiate()) decides, and
    /// keeps both messages as the session's [`InitRecord`].
    ///
    /// `O_NONBLOCK` belongs to the open file description, which every copy of the descriptor
    /// shares: every holder in this design tolerates it (see the crate docs).
    ///
    /// Must be called within a tokio runtime with I/O and time enabled. An error after
    /// mount(2) succeeded is [`Error::Initialize`]: the mount stays, dead, for the caller to
    /// unmount.
    pub async fn mount<H: Handler>(
        target: &Path,
        options: &MountOptions,
        handler: H,
    ) -> Result<Session, Error> {
        options.validate()?;
        tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let fd = device::open()?;
        let data = options.mount_data(fd.as_raw_fd())?;
        rustix::mount::mount(
            options.fs_name.as_str(),
            target,
            options.fs_type().as_str(),
            options.mount_flags(),
            data.as_c_str(),
        )
        .map_err(|e| Error::Mount {
            target: target.to_owned(),
            source: Error::io(e),
        })?;
        let started = async {
            let device = sys::register(fd).map_err(|(source, _fd)| Error::Register { source })?;
            let record = initialize(&device, options).await?;
            Ok::<_, Error>((device, record))
        }
        .await;
        let (device, record) = started.map_err(|e| Error::Initialize {
            target: target.to_owned(),
            source: Box::new(e),
        })?;
        Ok(Session::start(device, record, handler, &options.serve))
    }

    /// Serves a live, already initialized connection: a descriptor received from another
    /// process or from [`Session::pause`], with the [`InitRecord`] its INIT made. No INIT is
    /// read or written (the kernel sends none); the read buffer and everything else follow
    /// the record.
    ///
    /// Sets `O_NONBLOCK` if it is not set. Checks first, changing nothing: the options, that a
    /// runtime is there, that the record's protocol can be served, and that `fd` is
    /// `/dev/fuse`. A refusal gives the descriptor back in the [`AdoptError`], open: closing
    /// it could end the connection.
    ///
    /// To recover requests a dead holder had read, write
    /// [`notify_resend`](crate::notify_resend) on the descriptor before adopting it.
    ///
    /// Must be called within a tokio runtime with I/O and time enabled.
    pub fn adopt<H: Handler>(
        fd: OwnedFd,
        record: InitRecord,
        handler: H,
        serve: &ServeOptions,
    ) -> Result<Session, AdoptError> {
        let checked = serve
            .validate()
            .and_then(|()| tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime))
            .and_then(|_| check_record(&record))
            .and_then(|()| device::check_fuse_device(fd.as_fd()))
            .and_then(|()| device::set_nonblocking(fd.as_fd()));
        if let Err(error) = checked {
            return Err(AdoptError { error, fd });
        }
        let device = sys::register(fd).map_err(|(source, fd)| AdoptError {
            error: Error::Register { source },
            fd,
        })?;
        Ok(Session::start(device, record, handler, serve))
    }

    /// [`Session::adopt`] with the record as [`InitRecord::encode`] wrote it (as it travels
    /// between processes). A record that does not decode is [`Error::Record`], and the
    /// descriptor comes back untouched.
    pub fn adopt_encoded<H: Handler>(
        fd: OwnedFd,
        record: &[u8],
        handler: H,
        serve: &ServeOptions,
    ) -> Result<Session, AdoptError> {
        match InitRecord::decode(record) {
            Ok(record) => Session::adopt(fd, record, handler, serve),
            Err(source) => Err(AdoptError {
                error: Error::Record { source },
                fd,
            }),
        }
    }

    fn start<H: Handler>(
        device: AsyncFd<OwnedFd>,
        record: InitRecord,
        handler: H,
        serve: &ServeOptions,
    ) -> Session {
        let device = Arc::new(device);
        // `serve` was validated: at most 65536.
        let max_in_flight = u32::try_from(serve.max_in_flight).unwrap_or(u32::MAX);
        let permits = Arc::new(Semaphore::new(max_in_flight as usize));
        let in_flight = Arc::new(InFlight::default());
        let counts = Arc::new(Counts::default());
        let (command, command_rx) = watch::channel(Command::Serve);
        let (ended_tx, ended) = watch::channel(None);
        let reader = Reader {
            device: Arc::clone(&device),
            handler: Arc::new(handler),
            in_flight: Arc::clone(&in_flight),
            permits: Arc::clone(&permits),
            counts: Arc::clone(&counts),
            buffer_size: record.read_buffer_size(),
        };
        let reader = tokio::spawn(reader.run(command_rx, ended_tx));
        Session {
            device,
            record,
            control: Control {
                command,
                ended,
                reader: Some(reader),
                in_flight,
                permits,
                max_in_flight,
                counts,
            },
        }
    }

    /// The descriptor, to send a copy to a keeper (`fdpass`). The copy is the same
    /// connection; never read from it while this session serves.
    pub fn descriptor(&self) -> BorrowedFd<'_> {
        self.device.get_ref().as_fd()
    }

    /// What the connection negotiated at INIT.
    pub fn record(&self) -> &InitRecord {
        &self.record
    }

    /// Counts since the session started.
    pub fn counters(&self) -> Counters {
        self.control.counts.snapshot()
    }

    /// Requests being handled now.
    pub fn in_flight(&self) -> usize {
        self.control.in_flight.len()
    }

    /// Whether the session has stopped reading because the connection ended or a read
    /// failed ([`wait`](Self::wait) returns at once).
    pub fn has_ended(&self) -> bool {
        self.control.ended.borrow().is_some()
    }

    /// Waits until the connection ends: `Ok` when the kernel reports it gone (`ENODEV` after
    /// an unmount or an abort), an error when reading failed otherwise. Requests still being
    /// handled go on until the session is dropped (their replies fail).
    pub async fn wait(&self) -> Result<(), Error> {
        let mut ended = self.control.ended.clone();
        let end = ended
            .wait_for(Option::is_some)
            .await
            .map(|end| end.clone())
            .map_err(|_| Error::ReaderStopped)?;
        match end {
            Some(End::Gone) => Ok(()),
            Some(End::Failed(source)) => Err(Error::Read { source }),
            None => Err(Error::ReaderStopped),
        }
    }

    /// Stops reading and hands back the live connection, without unmounting.
    ///
    /// No new request is read from the moment this is called (requests the kernel queues
    /// meanwhile wait there for a successor). Requests already read are handled and answered;
    /// once none is left, the session ends and the descriptor comes back with the record in
    /// a [`Paused`].
    ///
    /// If requests are still being handled when `deadline` passes, the session reads and
    /// serves again and comes back in the [`PauseError`]: no caller waits on a session that
    /// no longer reads. A handler waiting for an INTERRUPT cannot get one while reading is
    /// stopped; that request holds the pause until the deadline.
    pub async fn pause(mut self, deadline: Duration) -> Result<Paused, PauseError> {
        let control = &mut self.control;
        control.command.send_replace(Command::Park);
        // Every request task holds a permit until its reply is written, and the reader holds
        // one while it reads: holding them all means nothing reads and nothing is in flight.
        let all = Arc::clone(&control.permits).acquire_many_owned(control.max_in_flight);
        let drained = match tokio::time::timeout(deadline, all).await {
            Ok(Ok(permits)) => Ok(permits),
            Ok(Err(_)) | Err(_) => Err(Error::PauseDeadline {
                deadline,
                in_flight: control.in_flight.len(),
            }),
        };
        // The copy to hand back: the same open file description under a new number, so the
        // session's own descriptor can go with the session.
        let copy = drained.and_then(|permits| {
            let copy = self.device.get_ref().try_clone();
            drop(permits);
            copy.map_err(|source| Error::Descriptor { op: "dup", source })
        });
        let fd = match copy {
            Ok(fd) => fd,
            Err(error) => {
                self.control.command.send_replace(Command::Serve);
                return Err(PauseError {
                    error,
                    session: self,
                });
            }
        };
        self.control.command.send_replace(Command::Quit);
        if let Some(reader) = self.control.reader.take() {
            let _ = reader.await;
        }
        let Session {
            device: _,
            record,
            control: _,
        } = self;
        Ok(Paused { fd, record })
    }
}

/// The record must name a protocol this crate serves.
fn check_record(record: &InitRecord) -> Result<(), Error> {
    if record.major() != KERNEL_VERSION || record.minor() < OLDEST_SUPPORTED_MINOR {
        return Err(Error::UnsupportedProtocol {
            major: record.major(),
            minor: record.minor(),
        });
    }
    Ok(())
}

/// Reads the INIT request of a fresh connection, answers it, and records both.
async fn initialize(
    device: &AsyncFd<OwnedFd>,
    options: &MountOptions,
) -> Result<InitRecord, Error> {
    // The kernel takes any buffer of at least this size before INIT.
    let mut buf = vec![0u8; fuse_wire::read_buffer_size(options.max_write)];
    let len = device::read_request(device, &mut buf)
        .await
        .map_err(|source| Error::InitRead { source })?
        .ok_or_else(|| Error::InitRead {
            source: Error::io(rustix::io::Errno::NODEV),
        })?;
    let bytes = buf.get(..len).unwrap_or_default().to_vec();
    let request = Request::decode(&bytes).map_err(|source| Error::InitDecode { source })?;
    let Operation::Init(init) = request.op else {
        return Err(Error::NotInit {
            opcode: request.header.opcode,
        });
    };
    let unique = request.header.unique;
    let mut reply = Vec::new();
    match negotiate(&init, options) {
        Ok(out) => reply::init(&mut reply, unique, &out, init.minor),
        Err(refusal) => {
            // The kernel fails the connection on an INIT error; the mount stays, dead.
            reply::error(&mut reply, unique, Errno::EPROTO);
            let _ = device::write_message(device.get_ref().as_fd(), &reply);
            return Err(refusal);
        }
    }
    let record = InitRecord::new(bytes, reply).map_err(|source| Error::Record { source })?;
    device::write_message(device.get_ref().as_fd(), record.reply_bytes())
        .map_err(|source| Error::InitWrite { source })?;
    Ok(record)
}

/// The reader task's state.
struct Reader<H> {
    device: Device,
    handler: Arc<H>,
    in_flight: Arc<InFlight>,
    permits: Arc<Semaphore>,
    counts: Arc<Counts>,
    buffer_size: usize,
}

impl<H: Handler> Reader<H> {
    async fn run(self, mut command: watch::Receiver<Command>, ended: watch::Sender<Option<End>>) {
        let mut buf = vec![0u8; self.buffer_size];
        loop {
            // Parked until told to serve again or to quit; a dropped session means quit.
            match command.wait_for(|&c| c != Command::Park).await.map(|c| *c) {
                Ok(Command::Serve) => {}
                Ok(Command::Park | Command::Quit) | Err(_) => return,
            }
            // A permit first, so that at the limit nothing is read: requests wait in the
            // kernel's queue. A command other than Serve wins over both waits; a permit
            // that is free at once needs no waiting (the command was just read).
            let permit = match Arc::clone(&self.permits).try_acquire_owned() {
                Ok(permit) => permit,
                Err(TryAcquireError::Closed) => return,
                Err(TryAcquireError::NoPermits) => tokio::select! {
                    biased;
                    _ = command.wait_for(|&c| c != Command::Serve) => continue,
                    permit = Arc::clone(&self.permits).acquire_owned() => match permit {
                        Ok(permit) => permit,
                        Err(_) => return,
                    },
                },
            };
            let read = tokio::select! {
                biased;
                _ = command.wait_for(|&c| c != Command::Serve) => continue,
                read = device::read_request(&self.device, &mut buf) => read,
            };
            match read {
                Ok(Some(len)) => {
                    if let Some(task) = self.dispatch(buf.get(..len).unwrap_or_default(), permit) {
                        self.run_task(task).await;
                    }
                }
                Ok(None) => {
                    debug!("FUSE connection gone; the session stops reading");
                    ended.send_replace(Some(End::Gone));
                    return;
                }
                Err(e) => {
                    error!(error = %e, "reading /dev/fuse failed; the session stops reading");
                    ended.send_replace(Some(End::Failed(Arc::new(e))));
                    return;
                }
            }
        }
    }

    /// Answers what the session answers itself; the handler's task for the rest.
    fn dispatch(&self, message: &[u8], permit: OwnedSemaphorePermit) -> Option<Task> {
        bump(&self.counts.requests);
        let request = match Request::decode(message) {
            Ok(request) => request,
            Err(e) => {
                self.malformed(message, &e);
                return None;
            }
        };
        let header = request.header;
        let unique = header.unique;
        match request.op {
            Operation::Interrupt(arg) => {
                bump(&self.counts.interrupts);
                // An interrupt for a request not in the table finds it answered already (a
                // request enters the table before the next read) or read by another holder
                // (a successor recovers those with RESEND). No reply either way: an EAGAIN
                // would make the kernel requeue the interrupt at once, in a loop.
                let found = self.in_flight.interrupt(arg.unique);
                debug!(target = arg.unique, found, "FUSE interrupt");
            }
            Operation::Init(_) => {
                bump(&self.counts.unexpected_inits);
                warn!(
                    ?unique,
                    "INIT on a connection already initialized; answering EIO"
                );
                self.answer_now(Reply::error(unique, Errno::EIO), unique, header.opcode);
            }
            Operation::Destroy => {
                debug!("FUSE DESTROY");
                self.answer_now(Reply::empty(unique), unique, header.opcode);
            }
            Operation::Unknown { opcode, .. } => {
                bump(&self.counts.unsupported);
                debug!(%opcode, "unsupported FUSE opcode; answering ENOSYS");
                self.answer_now(Reply::error(unique, Errno::ENOSYS), unique, opcode);
            }
            op => return Some(self.task(message, header, !op.is_forget(), permit)),
        }
        None
    }

    fn malformed(&self, message: &[u8], e: &fuse_wire::Error) {
        bump(&self.counts.malformed);
        let Some(header) = InHeader::read_from(message) else {
            error!(error = %e, "unanswerable FUSE request: no header");
            return;
        };
        let no_reply = matches!(
            header.opcode,
            Opcode::FORGET | Opcode::BATCH_FORGET | Opcode::INTERRUPT
        );
        error!(error = %e, unique = ?header.unique, "malformed FUSE request");
        if !no_reply {
            self.answer_now(
                Reply::error(header.unique, Errno::EIO),
                header.unique,
                header.opcode,
            );
        }
    }

    fn answer_now(&self, reply: Reply, unique: Unique, opcode: Opcode) {
        answer(&self.device, &self.counts, unique, opcode, reply);
    }

    /// The task that handles one request, writes its reply and returns its permit.
    fn task(
        &self,
        message: &[u8],
        header: InHeader,
        needs_reply: bool,
        permit: OwnedSemaphorePermit,
    ) -> Task {
        let bytes = message.to_vec();
        let (context, interrupt) = RequestContext::new();
        let unique = header.unique;
        let device = Arc::clone(&self.device);
        let handler = Arc::clone(&self.handler);
        let in_flight = Arc::clone(&self.in_flight);
        let counts = Arc::clone(&self.counts);
        let task = async move {
            let handled = AssertUnwindSafe(async {
                match Request::decode(&bytes) {
                    Ok(request) => handler.handle(context, request).await,
                    // Unreachable: the reader decoded these very bytes.
                    Err(_) => Reply::error(unique, Errno::EIO),
                }
            })
            .catch_unwind()
            .await;
            let reply = handled.unwrap_or_else(|_| {
                error!(?unique, opcode = %header.opcode, "FUSE handler panicked; answering EIO");
                bump(&counts.replaced_replies);
                Reply::error(unique, Errno::EIO)
            });
            if needs_reply {
                let delivered = answer(&device, &counts, unique, header.opcode, reply);
                handler.replied(unique, header.opcode, delivered);
            }
            in_flight.finish(unique.raw());
            // The descriptor before the permit: once a pause holds every permit, no task
            // holds the descriptor.
            drop(device);
            drop(permit);
        };
        Task {
            unique,
            interrupt,
            future: Box::pin(task),
        }
    }

    /// Polls a request's task once here, on the reader; spawns it if it has to wait.
    ///
    /// A task that finishes in its first poll never enters the table: no interrupt can reach
    /// it, as the reader reads nothing while it runs.
    async fn run_task(&self, mut task: Task) {
        if self.in_flight.lock().closed {
            return;
        }
        let finished =
            std::future::poll_fn(|cx| Poll::Ready(task.future.as_mut().poll(cx).is_ready())).await;
        if finished {
            return;
        }
        let mut table = self.in_flight.lock();
        if table.closed {
            return;
        }
        // Under the lock: the task's own `finish` waits until its entry is in.
        bump(&self.counts.waited);
        let handle = tokio::spawn(task.future).abort_handle();
        table.requests.insert(
            task.unique.raw(),
            Entry {
                interrupt: task.interrupt,
                task: handle,
            },
        );
    }
}

/// Writes a reply, replacing a missing or wrong one with `EIO`, and logs what the kernel
/// refuses. Whether the kernel took the handler's reply as it was.
fn answer(
    device: &AsyncFd<OwnedFd>,
    counts: &Counts,
    unique: Unique,
    opcode: Opcode,
    reply: Reply,
) -> bool {
    let (message, body, replaced) = match reply.into_parts() {
        Some((message, body)) if reply_is_for(&message, body.as_deref(), unique) => {
            (message, body, false)
        }
        wrong => {
            error!(
                ?unique,
                %opcode,
                missing = wrong.is_none(),
                "the FUSE handler's reply is missing or answers another request; answering EIO"
            );
            bump(&counts.replaced_replies);
            let mut eio = Vec::new();
            reply::error(&mut eio, unique, Errno::EIO);
            (eio, None, true)
        }
    };
    let fd = device.get_ref().as_fd();
    let written = match &body {
        None => device::write_message(fd, &message),
        Some(body) => device::write_message_vectored(fd, &message, body),
    };
    if let Err(e) = written {
        bump(&counts.failed_writes);
        match e.raw_os_error() {
            // ENOENT: the kernel no longer waits for this unique (the request was aborted,
            // or resent under the resend bit); ENODEV: the connection is gone.
            Some(code) if code == rustix::io::Errno::NOENT.raw_os_error() => {
                debug!(?unique, %opcode, "the kernel no longer waits for this reply");
            }
            Some(code) if code == rustix::io::Errno::NODEV.raw_os_error() => {
                debug!(?unique, %opcode, "reply after the connection ended");
            }
            _ => warn!(?unique, %opcode, error = %e, "writing a FUSE reply failed"),
        }
        return false;
    }
    !replaced
}

/// Whether `message` (followed by `body`, when the reply is written in two parts) is a
/// well-formed reply to `unique` that the kernel accepts: its header's length is the whole
/// reply's, its `unique` is the request's, its error is 0 or `-1..=-511`, and an error reply
/// has no body.
fn reply_is_for(message: &[u8], body: Option<&[u8]>, unique: Unique) -> bool {
    if let Some(body) = body {
        // Written in two parts: `message` is the header alone.
        return message.len() == fuse_wire::OUT_HEADER_SIZE
            && header_is_for(
                message,
                message.len() + body.len(),
                !body.is_empty(),
                unique,
            );
    }
    match reply::decode(message) {
        Ok((header, body)) => {
            header.unique == unique.raw()
                && (-511..=0).contains(&header.error)
                && (header.error == 0 || body.is_empty())
        }
        Err(_) => false,
    }
}

/// The header checks of [`reply_is_for`] for a reply of `len` bytes in all.
fn header_is_for(header: &[u8], len: usize, has_body: bool, unique: Unique) -> bool {
    match fuse_wire::OutHeader::read_from(header) {
        Some(header) => {
            usize::try_from(header.len).is_ok_and(|l| l == len)
                && header.unique == unique.raw()
                && (-511..=0).contains(&header.error)
                && (header.error == 0 || !has_body)
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_well_formed_reply_to_the_request_is_sent() {
        let unique = Unique(8);
        let ok = Reply::data(unique, b"data");
        assert!(reply_is_for(&ok.message().unwrap(), None, unique));
        assert!(!reply_is_for(&ok.message().unwrap(), None, Unique(10)));
        assert!(reply_is_for(
            &Reply::error(unique, Errno::ENOENT).message().unwrap(),
            None,
            unique
        ));
        // A header and a body written together: the header must name the whole length.
        let header = reply::header(unique, 4).unwrap();
        assert!(reply_is_for(&header, Some(b"data"), unique));
        assert!(
            !reply_is_for(&header, Some(b"dat"), unique),
            "a length that lies"
        );
        assert!(!reply_is_for(&header, Some(b"data"), Unique(10)));
        assert!(
            !reply_is_for(&header[..8], Some(b"data"), unique),
            "no whole header"
        );
        // An error with a body, an error out of range, a length that lies, no header.
        let mut with_body = Reply::error(unique, Errno::ENOENT)
            .message()
            .unwrap()
            .to_vec();
        with_body.extend_from_slice(&[0; 8]);
        with_body[0] = 24;
        assert!(!reply_is_for(&with_body, None, unique));
        let mut out_of_range = Reply::empty(unique).message().unwrap().to_vec();
        out_of_range[4..8].copy_from_slice(&(-512i32).to_ne_bytes());
        assert!(!reply_is_for(&out_of_range, None, unique));
        let mut positive = Reply::empty(unique).message().unwrap().to_vec();
        positive[4..8].copy_from_slice(&1i32.to_ne_bytes());
        assert!(!reply_is_for(&positive, None, unique));
        let mut lying = ok.message().unwrap().to_vec();
        lying.pop();
        assert!(!reply_is_for(&lying, None, unique));
        assert!(!reply_is_for(&[0; 8], None, unique));
    }

    #[test]
    fn the_in_flight_table_interrupts_finishes_and_closes() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let table = InFlight::default();
            let (context, interrupt) = RequestContext::new();
            let task = tokio::spawn(std::future::pending::<()>());
            table.lock().requests.insert(
                42,
                Entry {
                    interrupt,
                    task: task.abort_handle(),
                },
            );
            assert_eq!(table.len(), 1);
            assert!(!table.interrupt(44));
            assert!(table.interrupt(42));
            assert!(context.is_interrupted());
            table.close();
            assert_eq!(table.len(), 0);
            assert!(table.lock().closed);
            assert!(task.await.unwrap_err().is_cancelled());
            table.finish(42);
        });
    }

    #[test]
    fn sessions_and_what_they_hand_back_cross_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Session>();
        send_sync::<Paused>();
        send_sync::<AdoptError>();
        send_sync::<PauseError>();
        send_sync::<Error>();
    }

    #[test]
    fn counters_snapshot_what_was_counted() {
        let counts = Counts::default();
        bump(&counts.requests);
        bump(&counts.requests);
        bump(&counts.unsupported);
        bump(&counts.waited);
        assert_eq!(
            counts.snapshot(),
            Counters {
                requests: 2,
                unsupported: 1,
                waited: 1,
                ..Counters::default()
            }
        );
    }
}
