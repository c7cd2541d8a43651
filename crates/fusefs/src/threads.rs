//! Threads that serve mounts, each with a single-threaded runtime of its own.
//!
//! A mount served on a multi-threaded runtime hands each request from thread to thread: the
//! session's reader, the request's task, the worker connection's task and the I/O driver
//! land wherever the scheduler puts them, and every hand-off to a sleeping thread is a
//! wake-up. On one thread they take turns instead. The fusefs floor benchmark measured the
//! difference on a loopback worker: a client call's CPU fell by about half and the FUSE
//! server's CPU per `lstat` by about a third (the fusefs README, "Serving threads").
//!
//! A mount is placed on a thread by running everything that spawns its tasks there: its
//! session ([`mount_on`](crate::mount_on) the thread's runtime, or call
//! [`adopt`](crate::adopt) inside [`Handle::enter`]) and its worker connections (a transport
//! made with `HttpsTransport::on_runtime`). Mounts are spread over the threads in turn; one
//! mount is served by one thread, so a mount's requests use at most one CPU between them.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// A fixed set of threads, each running a single-threaded tokio runtime until dropped.
#[derive(Debug)]
pub struct ServingThreads {
    threads: Vec<ServingThread>,
    next: AtomicUsize,
}

#[derive(Debug)]
struct ServingThread {
    runtime: Handle,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl ServingThreads {
    /// `count` threads (at least one), named `{name}-0`, `{name}-1`, ...
    pub fn new(name: &str, count: usize) -> io::Result<ServingThreads> {
        let threads = (0..count.max(1))
            .map(|index| ServingThread::start(format!("{name}-{index}")))
            .collect::<io::Result<Vec<_>>>()?;
        Ok(ServingThreads {
            threads,
            next: AtomicUsize::new(0),
        })
    }

    /// One thread per CPU this process may use (its affinity and CPU quota count), at
    /// least one.
    pub fn per_cpu(name: &str) -> io::Result<ServingThreads> {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        ServingThreads::new(name, cpus)
    }

    /// The runtime of the thread whose turn it is.
    pub fn next(&self) -> Handle {
        let at = self.next.fetch_add(1, Ordering::Relaxed) % self.threads.len();
        self.threads[at].runtime.clone()
    }

    /// How many threads there are.
    pub fn len(&self) -> usize {
        self.threads.len()
    }

    /// Always false: there is at least one thread.
    pub fn is_empty(&self) -> bool {
        self.threads.is_empty()
    }
}

impl ServingThread {
    fn start(name: String) -> io::Result<ServingThread> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            // Either a stop or the sender dropped ends the thread.
            let _ = runtime.block_on(stopped);
        })?;
        Ok(ServingThread {
            runtime: handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for ServingThread {
    /// Stops the thread and waits for it: the tasks still on its runtime are dropped, as a
    /// runtime's are when it shuts down.
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            // A thread cannot wait for itself: dropped by one of its own tasks, it ends once
            // that task returns.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_are_spread_over_the_threads_in_turn_and_the_threads_end_when_dropped() {
        let threads = ServingThreads::new("serving-test", 2).unwrap();
        assert_eq!(threads.len(), 2);
        let names: Vec<String> = (0..4)
            .map(|_| {
                let runtime = threads.next();
                let (tx, rx) = std::sync::mpsc::channel();
                runtime.spawn(async move {
                    let name = std::thread::current().name().map(str::to_owned);
                    tx.send(name).unwrap();
                });
                rx.recv().unwrap().unwrap()
            })
            .collect();
        assert_eq!(
            names,
            [
                "serving-test-0",
                "serving-test-1",
                "serving-test-0",
                "serving-test-1"
            ]
        );

        let runtime = threads.next();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        runtime.spawn(async move {
            let _held = tx;
            std::future::pending::<()>().await;
        });
        drop(threads);
        // The pending task was dropped with its runtime, and its sender with it.
        assert!(rx.recv().is_err());
    }

    #[test]
    fn zero_threads_means_one() {
        let threads = ServingThreads::new("serving-test", 0).unwrap();
        assert_eq!(threads.len(), 1);
        assert!(!threads.is_empty());
    }
}
