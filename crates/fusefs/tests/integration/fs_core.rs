//! The `Fs` core driven through its methods, as the adapter would, against the reference
//! worker over loopback TLS: no `/dev/fuse`, no mount.

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fusefs::{Caller, Error, Fs, FsConfig, ROOT_NODE, WriteFlags};
use lease_client::protocol::{MAX_DATA_BYTES, VolumeGeneration};
use lease_client::{Client, ClientConfig, EndpointSet, HttpsTransport};
use worker::{AccessMode, Timings};

use crate::support::{SCALE, TestFs, Volume, Watchdog, budgets, runtime};

const FILE: u32 = libc::S_IFREG | 0o644;
const RDWR: u32 = libc::O_RDWR as u32;

/// Kernel request IDs: each call gets a new one, as the kernel's are.
static UNIQUE: AtomicU64 = AtomicU64::new(1000);

/// The next call's caller: the test process itself (the worker gives new files to the
/// caller, which an unprivileged worker can do only for its own user).
fn next() -> Caller {
    Caller {
        // As the kernel numbers requests: in steps of two, bit 0 marking an INTERRUPT.
        unique: UNIQUE.fetch_add(2, Ordering::SeqCst),
        uid: rustix::process::geteuid().as_raw(),
        gid: rustix::process::getegid().as_raw(),
    }
}

fn raw<T>(result: Result<T, Error>) -> Result<T, i32> {
    result.map_err(|error| error.errno().raw())
}

/// Runs `body` with a worker. No root needed: without it the worker reopens files by
/// descriptor instead of by handle (`worker::Reopen`), and nothing is mounted.
fn with_worker(test: &'static str, timings: Timings, body: impl AsyncFnOnce(&Volume)) {
    let _watchdog = Watchdog::arm(test, Duration::from_secs(60));
    let rt = runtime();
    rt.block_on(async {
        let volume = Volume::start_with(AccessMode::Rwx, timings).await;
        body(&volume).await;
    });
}

fn fs_of(volume: &Volume, config: FsConfig) -> TestFs {
    Fs::new(volume.client(), config).unwrap()
}

#[test]
fn lookups_are_counted_and_forgotten() {
    with_worker(
        "lookups_are_counted_and_forgotten",
        Timings::default().scaled(SCALE),
        async |volume| {
            let fs = fs_of(volume, FsConfig::default());
            assert_eq!(fs.node_count(), 1, "the root only");

            // CREATE hands the kernel an entry: one lookup. The node ID is the worker's inode
            // number (the backing file's), the generation the worker's inode generation.
            let created = fs
                .create(next(), ROOT_NODE, OsStr::new("f"), FILE, RDWR)
                .await
                .unwrap();
            let ino = created.entry.attr.ino;
            let backing = std::fs::metadata(volume.backing_dir().join("f")).unwrap();
            assert_eq!(ino, backing.ino());
            assert_ne!(created.entry.generation, 0);
            assert_eq!((fs.node_count(), fs.open_handles()), (2, 1));
            fs.release(next(), ino, created.opened.handle, 0)
                .await
                .unwrap();
            assert_eq!(fs.open_handles(), 0);

            // Two LOOKUPs more: three in all; the node stays until all three are forgotten.
            for _ in 0..2 {
                let entry = fs.lookup(next(), ROOT_NODE, OsStr::new("f")).await.unwrap();
                assert_eq!(
                    (entry.attr.ino, entry.generation),
                    (ino, created.entry.generation)
                );
            }
            fs.forget(ino, 2);
            assert_eq!(fs.node_count(), 2);
            fs.getattr(next(), ino, None).await.unwrap();
            fs.forget(ino, 1);
            assert_eq!(fs.node_count(), 1);
            // A forgotten node is unknown: ESTALE, and nothing is sent to the worker.
            let sent = volume.arrivals();
            assert_eq!(
                raw(fs.getattr(next(), ino, None).await).err(),
                Some(libc::ESTALE)
            );
            assert_eq!(volume.arrivals(), sent);
            // The root is never forgotten; a failed lookup adds nothing.
            fs.forget(ROOT_NODE, 100);
            assert_eq!(
                raw(fs.lookup(next(), ROOT_NODE, OsStr::new("missing")).await).err(),
                Some(libc::ENOENT)
            );
            assert_eq!(fs.node_count(), 1);
            fs.getattr(next(), ROOT_NODE, None).await.unwrap();

            // MKDIR, SYMLINK and LINK hand out entries too; LINK's is the same node again.
            let dir = fs
                .mkdir(next(), ROOT_NODE, OsStr::new("d"), 0o755, 0)
                .await
                .unwrap();
            let f = fs.lookup(next(), ROOT_NODE, OsStr::new("f")).await.unwrap();
            let link = fs
                .link(next(), f.attr.ino, dir.attr.ino, OsStr::new("g"))
                .await
                .unwrap();
            assert_eq!(link.attr.ino, ino);
            assert_eq!(link.attr.nlink, 2);
            fs.symlink(next(), dir.attr.ino, OsStr::new("l"), OsStr::new("../f"))
                .await
                .unwrap();
            assert_eq!(fs.node_count(), 4, "root, d, f (twice), l");
            fs.forget(ino, 2);
            assert_eq!(fs.node_count(), 3);
        },
    );
}

#[test]
fn an_interrupt_before_sending_gives_eintr_and_sends_nothing() {
    with_worker(
        "an_interrupt_before_sending_gives_eintr_and_sends_nothing",
        Timings::default().scaled(SCALE),
        async |volume| {
            let fs = Arc::new(fs_of(volume, FsConfig::default()));
            let caller = |unique| Caller { unique, ..next() };
            let tree = crate::support::tree(&volume.backing_dir());
            let sent = volume.arrivals();

            // The kernel interrupts request 42 before the filesystem gets to it.
            fs.interrupt(42);
            assert_eq!(
                raw(fs
                    .create(caller(42), ROOT_NODE, OsStr::new("f"), FILE, RDWR)
                    .await)
                .err(),
                Some(libc::EINTR)
            );
            assert_eq!(volume.arrivals(), sent, "nothing was sent");
            assert_eq!(crate::support::tree(&volume.backing_dir()), tree);
            // The interrupt is used up; other requests are not affected.
            fs.interrupt(43);
            fs.mkdir(caller(44), ROOT_NODE, OsStr::new("d"), 0o755, 0)
                .await
                .unwrap();
            assert_eq!(
                raw(fs.unlink(caller(43), ROOT_NODE, OsStr::new("d")).await).err(),
                Some(libc::EINTR)
            );
            assert!(volume.backing_dir().join("d").is_dir(), "not unlinked");
            let created = fs
                .create(caller(42), ROOT_NODE, OsStr::new("f"), FILE, RDWR)
                .await
                .unwrap();

            // An interrupt that comes after the request was sent changes nothing: the write,
            // all of its parts, runs to its outcome.
            let data: Vec<u8> = (0..MAX_DATA_BYTES).map(|i| (i % 253) as u8).collect();
            volume
                .server()
                .faults()
                .set_delay(Duration::from_millis(150));
            let write = tokio::spawn({
                let (fs, data) = (Arc::clone(&fs), data.clone());
                async move {
                    fs.write(
                        caller(50),
                        created.entry.attr.ino,
                        created.opened.handle,
                        0,
                        &data,
                        WriteFlags::default(),
                    )
                    .await
                }
            });
            tokio::time::sleep(Duration::from_millis(50)).await;
            fs.interrupt(50);
            assert_eq!(write.await.unwrap().unwrap() as usize, data.len());
            volume.server().faults().set_delay(Duration::ZERO);
            assert!(std::fs::read(volume.backing_dir().join("f")).unwrap() == data);
        },
    );
}

#[test]
fn readdir_in_small_batches_yields_every_entry_once() {
    with_worker(
        "readdir_in_small_batches_yields_every_entry_once",
        Timings::default().scaled(SCALE),
        async |volume| {
            const COUNT: usize = 50;
            const BATCH: u32 = 7;
            let fs = fs_of(
                volume,
                FsConfig {
                    readdir_batch: BATCH,
                    ..FsConfig::default()
                },
            );
            let dir = fs
                .mkdir(next(), ROOT_NODE, OsStr::new("dir"), 0o755, 0)
                .await
                .unwrap()
                .attr
                .ino;
            for i in 0..COUNT {
                std::fs::write(volume.backing_dir().join(format!("dir/e{i:02}")), b"").unwrap();
            }

            // READDIR: the kernel asks again from the last offset it got until nothing comes.
            let sent = volume.arrivals();
            let mut names = Vec::new();
            let mut offsets = Vec::new();
            let mut offset = 0;
            loop {
                let batch = fs.readdir(next(), dir, offset).await.unwrap();
                let Some(last) = batch.last() else { break };
                assert!(batch.len() <= BATCH as usize + 2);
                offset = last.offset;
                for entry in batch {
                    names.push(entry.name.into_string().unwrap());
                    offsets.push(entry.offset);
                }
            }
            let calls = volume.arrivals() - sent;
            assert_eq!(calls, COUNT.div_ceil(BATCH as usize) + 1, "batches");
            let mut sorted = names.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), COUNT + 2, "every name once: {names:?}");
            assert_eq!(&names[..2], [".", ".."]);
            assert!(offsets.windows(2).all(|w| w[0] < w[1]), "offsets increase");

            // Resuming from any offset gives the rest (a kernel buffer that took only part).
            let from = 20;
            let mut rest = Vec::new();
            let mut offset = offsets[from - 1];
            loop {
                let batch = fs.readdir(next(), dir, offset).await.unwrap();
                let Some(last) = batch.last() else { break };
                offset = last.offset;
                rest.extend(batch.into_iter().map(|e| e.name.into_string().unwrap()));
            }
            assert_eq!(rest, names[from..]);

            // READDIRPLUS: the same entries with attributes; each one the kernel takes is a
            // lookup, which FORGET gives back.
            let before = fs.node_count();
            let mut plus = Vec::new();
            let mut offset = 0;
            loop {
                let batch: Vec<_> = fs.readdirplus(next(), dir, offset).await.unwrap().collect();
                let Some(last) = batch.last() else { break };
                offset = last.dirent.offset;
                for entry in batch {
                    plus.push((entry.dirent.name.into_string().unwrap(), entry.dirent.ino));
                }
            }
            assert_eq!(
                plus.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(),
                names
            );
            assert_eq!(fs.node_count(), before + COUNT);
            for (name, ino) in &plus[2..] {
                let attr = fs.getattr(next(), *ino, None).await.unwrap().attr;
                assert_eq!(attr.ino, *ino, "{name}");
                fs.forget(*ino, 1);
            }
            assert_eq!(fs.node_count(), before);
        },
    );
}

#[test]
fn reads_and_writes_are_split_into_parts_and_reassembled_in_order() {
    with_worker(
        "reads_and_writes_are_split_into_parts_and_reassembled_in_order",
        Timings::default().scaled(SCALE),
        async |volume| {
            // Parts of 1 MiB, the most one call carries, and of the default size, which puts
            // several calls of one request in flight at once.
            for part in [MAX_DATA_BYTES, FsConfig::default().call_data_bytes] {
                let fs = fs_of(
                    volume,
                    FsConfig {
                        call_data_bytes: part,
                        ..FsConfig::default()
                    },
                );
                let name = format!("big-{part}");
                let created = fs
                    .create(next(), ROOT_NODE, OsStr::new(&name), FILE, RDWR)
                    .await
                    .unwrap();
                let (ino, fh) = (created.entry.attr.ino, created.opened.handle);
                let len = 3 * MAX_DATA_BYTES + MAX_DATA_BYTES / 2;
                let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();

                let sent = volume.arrivals();
                let written = fs
                    .write(next(), ino, fh, 0, &data, WriteFlags::default())
                    .await
                    .unwrap();
                assert_eq!(written as usize, len);
                assert_eq!(
                    volume.arrivals() - sent,
                    len.div_ceil(part),
                    "a call per part"
                );
                assert!(std::fs::read(volume.backing_dir().join(&name)).unwrap() == data);

                // A read asking for more than there is: the part with the end is short.
                let sent = volume.arrivals();
                let read = fs
                    .read(next(), ino, fh, 0, u32::try_from(len + 4096).unwrap())
                    .await
                    .unwrap();
                assert!(read[..] == data[..], "reassembled in order");
                assert_eq!(volume.arrivals() - sent, (len + 4096).div_ceil(part));

                // An unaligned read across part boundaries.
                let sent = volume.arrivals();
                let at = MAX_DATA_BYTES - 10;
                let read = fs
                    .read(next(), ino, fh, at as u64, 2 * MAX_DATA_BYTES as u32)
                    .await
                    .unwrap();
                assert!(read[..] == data[at..at + 2 * MAX_DATA_BYTES]);
                assert_eq!(
                    volume.arrivals() - sent,
                    (2 * MAX_DATA_BYTES).div_ceil(part)
                );

                // Past the end: nothing, and no error.
                let read = fs
                    .read(next(), ino, fh, 2 * len as u64, 4096)
                    .await
                    .unwrap();
                assert!(read.is_empty());
                fs.release(next(), ino, fh, 0).await.unwrap();
            }
        },
    );
}

#[test]
fn renewal_keeps_handles_past_their_lease_and_forgets_expired_ones() {
    const HANDLE_LEASE: Duration = Duration::from_millis(1200);
    let timings = Timings {
        handle_lease: HANDLE_LEASE,
        reclaim_interval: Duration::from_millis(50),
        ..Timings::default().scaled(SCALE)
    };
    with_worker(
        "renewal_keeps_handles_past_their_lease_and_forgets_expired_ones",
        timings,
        async |volume| {
            let fs = Arc::new(fs_of(
                volume,
                FsConfig {
                    default_handle_renewal: Duration::from_millis(200),
                    ..FsConfig::default()
                },
            ));
            let created = fs
                .create(next(), ROOT_NODE, OsStr::new("f"), FILE, RDWR)
                .await
                .unwrap();
            let (ino, fh) = (created.entry.attr.ino, created.opened.handle);
            fs.write(next(), ino, fh, 0, b"kept", WriteFlags::default())
                .await
                .unwrap();

            // Renewed by hand: the next renewal is due after a third of the stated lease.
            let next_renewal = fs.renew_handles().await.unwrap();
            assert_eq!(next_renewal, HANDLE_LEASE / 3);

            // Renewed by the background task for twice the lease: the handle still reads.
            let renewal = tokio::spawn({
                let fs = Arc::clone(&fs);
                async move { fs.run_handle_renewal().await }
            });
            tokio::time::sleep(2 * HANDLE_LEASE).await;
            assert_eq!(&fs.read(next(), ino, fh, 0, 16).await.unwrap()[..], b"kept");
            renewal.abort();

            // Not renewed for longer than the lease: the worker reclaims it (EBADF), and the
            // next renewal learns that and forgets it.
            tokio::time::sleep(HANDLE_LEASE + Duration::from_millis(300)).await;
            assert_eq!(
                raw(fs.read(next(), ino, fh, 0, 16).await).err(),
                Some(libc::EBADF)
            );
            assert_eq!(fs.open_handles(), 1);
            fs.renew_handles().await.unwrap();
            assert_eq!(fs.open_handles(), 0);
        },
    );
}

/// A client for `volume` with a changed configuration.
fn client_with(volume: &Volume, change: impl FnOnce(&mut ClientConfig)) -> TestFs {
    let budgets = budgets();
    let mut config = ClientConfig {
        volume_id: volume.spec.volume_id.clone(),
        volume_generation: VolumeGeneration(volume.spec.volume_generation),
        access_mode: volume.spec.access_mode.to_wire(),
        endpoints: EndpointSet::new([volume.endpoint()]).unwrap(),
        budgets,
    };
    change(&mut config);
    let transport = HttpsTransport::with_credentials(
        &config.budgets,
        &volume
            .worker
            .pki()
            .credentials(fusefs::testing::TOKEN)
            .unwrap(),
    );
    Fs::new(Client::new(config, transport), FsConfig::default()).unwrap()
}

#[test]
fn each_failure_class_has_its_errno() {
    with_worker(
        "each_failure_class_has_its_errno",
        Timings::default().scaled(SCALE),
        async |volume| {
            let getattr = async |fs: &TestFs| raw(fs.getattr(next(), ROOT_NODE, None).await).err();

            // The worker's own errno passes through.
            let fs = fs_of(volume, FsConfig::default());
            assert_eq!(
                raw(fs.rmdir(next(), ROOT_NODE, OsStr::new("nothing")).await).err(),
                Some(libc::ENOENT)
            );
            // Another volume generation: the staged volume is gone, ESTALE.
            let fs = client_with(volume, |c| c.volume_generation = VolumeGeneration(2));
            assert_eq!(getattr(&fs).await, Some(libc::ESTALE));
            // A volume the workers do not have: ENODEV.
            let fs = client_with(volume, |c| c.volume_id = "v1.nowhere".into());
            assert_eq!(getattr(&fs).await, Some(libc::ENODEV));
            // No admission slot within the budget: EAGAIN, nothing sent.
            let fs = client_with(volume, |c| c.budgets.max_in_flight = 0);
            let sent = volume.arrivals();
            assert_eq!(getattr(&fs).await, Some(libc::EAGAIN));
            assert_eq!(volume.arrivals(), sent);
            // Nothing listens at the endpoint: ETIMEDOUT after the budget.
            let fs = client_with(volume, |c| {
                c.endpoints = EndpointSet::new(["127.0.0.1:1"]).unwrap();
            });
            let started = std::time::Instant::now();
            assert_eq!(getattr(&fs).await, Some(libc::ETIMEDOUT));
            assert!(started.elapsed() >= budgets().call / 2);
            // Requests taken and never answered: a mutation's outcome is unknown, EIO; a
            // read cannot have changed anything, ETIMEDOUT.
            let fs = fs_of(volume, FsConfig::default());
            volume.server().faults().set_hang(true);
            assert_eq!(
                raw(fs.mkdir(next(), ROOT_NODE, OsStr::new("d"), 0o755, 0).await).err(),
                Some(libc::EIO)
            );
            assert_eq!(getattr(&fs).await, Some(libc::ETIMEDOUT));
            volume.server().faults().set_hang(false);
            // Wrong credentials: EACCES.
            let budgets = budgets();
            let config = volume.client().config().clone();
            let credentials = volume.worker.pki().credentials("not-the-token").unwrap();
            let fs = Fs::new(
                Client::new(
                    config,
                    HttpsTransport::with_credentials(&budgets, &credentials),
                ),
                FsConfig::default(),
            )
            .unwrap();
            assert_eq!(getattr(&fs).await, Some(libc::EACCES));
        },
    );
}
