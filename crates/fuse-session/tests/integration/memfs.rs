//! The tests' filesystem: a root directory with a few files in memory, read, write, create,
//! unlink, getattr, setattr (size and mode), lookup, readdir, readdirplus and statfs. Every
//! lifetime is 0 and every open is direct I/O, so each call through the mount reaches the
//! handler. A LOOKUP of [`STUCK`] can be made to hang.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::sync::{Arc, Mutex, MutexGuard};

use fuse_session::{Handler, Reply, RequestContext};
use fuse_wire::{
    Attr, AttrOut, DirBuffer, DirEntry, DirPlusBuffer, EntryOut, Errno, FopenFlags, InHeader,
    Opcode, OpenOut, Operation, Request, SetattrValid, StatfsOut, Unique, WriteOut, dirent_type,
    reply,
};
use tokio::sync::{mpsc, watch};

/// The contents of `hello`.
pub(crate) const HELLO: &[u8] = b"hello, world\n";
/// The size of `data`.
pub(crate) const DATA_LEN: usize = 64 * 1024;
/// The name whose LOOKUP a [`Stuck`] handler holds.
pub(crate) const STUCK: &str = "stuck";

/// Byte `i` of `data`.
pub(crate) fn data_byte(i: usize) -> u8 {
    (i % 251) as u8
}

const DIR: u32 = 0o040_000;
const FILE: u32 = 0o100_000;

#[derive(Debug, Clone)]
struct Node {
    parent: u64,
    name: OsString,
    mode: u32,
    data: Vec<u8>,
}

#[derive(Debug)]
struct Tree {
    nodes: BTreeMap<u64, Node>,
    next_ino: u64,
    next_fh: u64,
}

impl Tree {
    fn new() -> Tree {
        let mut nodes = BTreeMap::new();
        let mut add = |ino, name: &str, mode, data: Vec<u8>| {
            nodes.insert(
                ino,
                Node {
                    parent: 1,
                    name: name.into(),
                    mode,
                    data,
                },
            );
        };
        add(1, "", DIR | 0o755, Vec::new());
        add(2, "hello", FILE | 0o644, HELLO.to_vec());
        add(
            3,
            "data",
            FILE | 0o644,
            (0..DATA_LEN).map(data_byte).collect(),
        );
        add(4, STUCK, FILE | 0o644, b"unstuck\n".to_vec());
        Tree {
            nodes,
            next_ino: 5,
            next_fh: 1,
        }
    }

    fn child(&self, parent: u64, name: &OsStr) -> Option<u64> {
        self.nodes
            .iter()
            .find(|&(&ino, n)| ino != 1 && n.parent == parent && n.name == name)
            .map(|(&ino, _)| ino)
    }

    fn attr(&self, ino: u64) -> Option<Attr> {
        let node = self.nodes.get(&ino)?;
        let size = node.data.len() as u64;
        Some(Attr {
            ino,
            size,
            blocks: size.div_ceil(512),
            mode: node.mode,
            nlink: if node.mode & DIR != 0 { 2 } else { 1 },
            blksize: 4096,
            ..Attr::default()
        })
    }

    fn entry(&self, ino: u64) -> Option<EntryOut> {
        Some(EntryOut {
            nodeid: ino,
            generation: 1,
            attr: self.attr(ino)?,
            ..EntryOut::default()
        })
    }

    fn fh(&mut self) -> u64 {
        self.next_fh += 1;
        self.next_fh
    }
}

/// How a LOOKUP of [`STUCK`] is held.
#[derive(Debug, Clone)]
pub(crate) enum Stuck {
    /// Answered like any other.
    Never,
    /// Never answered.
    Forever,
    /// Answered once the gate is `true`.
    UntilOpened(watch::Receiver<bool>),
    /// Answered `EINTR` once the kernel interrupts it.
    UntilInterrupted,
    /// The handler panics before it awaits anything.
    Panics,
}

/// One request a handler saw.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    /// Its opcode.
    pub(crate) opcode: Opcode,
    /// Its `unique`, as received.
    pub(crate) unique: Unique,
    /// The name, for a LOOKUP.
    pub(crate) name: Option<OsString>,
}

/// The requests one handler instance saw, and what became of its replies.
#[derive(Debug, Default)]
pub(crate) struct Log {
    seen: Mutex<Vec<Seen>>,
    replied: Mutex<Vec<(Opcode, Unique, bool)>>,
}

impl Log {
    fn record(&self, header: &InHeader, op: &Operation<'_>) {
        let name = match op {
            Operation::Lookup { name } => Some(name.to_os_string()),
            _ => None,
        };
        lock(&self.seen).push(Seen {
            opcode: header.opcode,
            unique: header.unique,
            name,
        });
    }

    /// How many requests of `opcode`.
    pub(crate) fn count(&self, opcode: Opcode) -> usize {
        lock(&self.seen)
            .iter()
            .filter(|s| s.opcode == opcode)
            .count()
    }

    /// Each reply written: its request's opcode and `unique`, and whether the kernel took it.
    pub(crate) fn replied(&self) -> Vec<(Opcode, Unique, bool)> {
        lock(&self.replied).clone()
    }

    /// The `unique` of every LOOKUP of `name`.
    pub(crate) fn lookups_of(&self, name: &str) -> Vec<Unique> {
        lock(&self.seen)
            .iter()
            .filter(|s| s.opcode == Opcode::LOOKUP && s.name.as_deref() == Some(OsStr::new(name)))
            .map(|s| s.unique)
            .collect()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The handler.
#[derive(Debug)]
pub(crate) struct MemFs {
    tree: Arc<Mutex<Tree>>,
    log: Arc<Log>,
    stuck: Stuck,
    entered: Option<mpsc::UnboundedSender<Unique>>,
}

impl MemFs {
    /// The initial tree: `hello`, `data`, `stuck`.
    pub(crate) fn new() -> MemFs {
        MemFs {
            tree: Arc::new(Mutex::new(Tree::new())),
            log: Arc::default(),
            stuck: Stuck::Never,
            entered: None,
        }
    }

    /// A new instance over the same tree (files and handles), with its own log.
    pub(crate) fn sharing(&self) -> MemFs {
        MemFs {
            tree: Arc::clone(&self.tree),
            ..MemFs::new()
        }
    }

    /// Holds a LOOKUP of [`STUCK`] as `how` says, sending its `unique` on `entered` first.
    pub(crate) fn stuck(self, how: Stuck, entered: mpsc::UnboundedSender<Unique>) -> MemFs {
        MemFs {
            stuck: how,
            entered: Some(entered),
            ..self
        }
    }

    /// The requests this instance saw.
    pub(crate) fn log(&self) -> Arc<Log> {
        Arc::clone(&self.log)
    }

    /// `None` to answer as usual.
    async fn hold(&self, context: &RequestContext, unique: Unique) -> Option<Reply> {
        if matches!(self.stuck, Stuck::Never) {
            return None;
        }
        if let Some(entered) = &self.entered {
            let _ = entered.send(unique);
        }
        match &self.stuck {
            Stuck::Never => None,
            Stuck::Forever => std::future::pending().await,
            Stuck::UntilOpened(gate) => {
                let _ = gate.clone().wait_for(|&open| open).await;
                None
            }
            Stuck::UntilInterrupted => {
                context.interrupted().await;
                Some(Reply::error(unique, Errno::EINTR))
            }
            Stuck::Panics => panic!("the handler of {STUCK} panics, as asked"),
        }
    }

    fn serve(&self, header: &InHeader, op: Operation<'_>) -> Reply {
        let unique = header.unique;
        let node = header.nodeid;
        let mut tree = lock(&self.tree);
        let enoent = || Reply::error(unique, Errno::ENOENT);
        match op {
            Operation::Lookup { name } => {
                match tree.child(node, name).and_then(|c| tree.entry(c)) {
                    Some(entry) => Reply::encode(|out| reply::entry(out, unique, &entry)),
                    None => enoent(),
                }
            }
            Operation::Getattr(_) => match tree.attr(node) {
                Some(attr) => attr_reply(unique, attr),
                None => enoent(),
            },
            Operation::Setattr(arg) => {
                let Some(n) = tree.nodes.get_mut(&node) else {
                    return enoent();
                };
                if arg.valid.contains(SetattrValid::SIZE) {
                    n.data.resize(arg.size as usize, 0);
                }
                if arg.valid.contains(SetattrValid::MODE) {
                    n.mode = (n.mode & 0o170_000) | (arg.mode & 0o7777);
                }
                match tree.attr(node) {
                    Some(attr) => attr_reply(unique, attr),
                    None => enoent(),
                }
            }
            Operation::Open(_) | Operation::Opendir(_) => {
                let open = OpenOut {
                    fh: tree.fh(),
                    open_flags: FopenFlags::DIRECT_IO,
                    ..OpenOut::default()
                };
                Reply::encode(|out| reply::open(out, unique, &open))
            }
            Operation::Create { arg, name } => {
                if tree.child(node, name).is_some() {
                    return Reply::error(unique, Errno::EEXIST);
                }
                let ino = tree.next_ino;
                tree.next_ino += 1;
                tree.nodes.insert(
                    ino,
                    Node {
                        parent: node,
                        name: name.to_os_string(),
                        mode: FILE | (arg.mode & 0o7777),
                        data: Vec::new(),
                    },
                );
                let open = OpenOut {
                    fh: tree.fh(),
                    open_flags: FopenFlags::DIRECT_IO,
                    ..OpenOut::default()
                };
                match tree.entry(ino) {
                    Some(entry) => Reply::encode(|out| reply::create(out, unique, &entry, &open)),
                    None => enoent(),
                }
            }
            Operation::Unlink { name } => match tree.child(node, name) {
                Some(child) => {
                    tree.nodes.remove(&child);
                    Reply::empty(unique)
                }
                None => enoent(),
            },
            Operation::Read(arg) => match tree.nodes.get(&node) {
                Some(n) => {
                    let start = (arg.offset as usize).min(n.data.len());
                    let end = start.saturating_add(arg.size as usize).min(n.data.len());
                    Reply::data(unique, &n.data[start..end])
                }
                None => enoent(),
            },
            Operation::Write { arg, data } => match tree.nodes.get_mut(&node) {
                Some(n) => {
                    let start = arg.offset as usize;
                    if n.data.len() < start + data.len() {
                        n.data.resize(start + data.len(), 0);
                    }
                    n.data[start..start + data.len()].copy_from_slice(data);
                    let written = WriteOut { size: arg.size };
                    Reply::encode(|out| reply::write(out, unique, &written))
                }
                None => enoent(),
            },
            Operation::Readdir(arg) => {
                let mut buf = DirBuffer::new(arg.size);
                for (index, ino, name, mode) in children(&tree, node, arg.offset) {
                    let entry = DirEntry {
                        ino,
                        off: index + 1,
                        kind: dirent_type(mode),
                        name: &name,
                    };
                    if !buf.push(&entry).unwrap_or(false) {
                        break;
                    }
                }
                Reply::data(unique, buf.as_bytes())
            }
            Operation::Readdirplus(arg) => {
                let mut buf = DirPlusBuffer::new(arg.size);
                for (index, ino, name, mode) in children(&tree, node, arg.offset) {
                    let entry = DirEntry {
                        ino,
                        off: index + 1,
                        kind: dirent_type(mode),
                        name: &name,
                    };
                    let Some(entry_out) = tree.entry(ino) else {
                        continue;
                    };
                    if !buf.push(&entry, &entry_out).unwrap_or(false) {
                        break;
                    }
                }
                Reply::data(unique, buf.as_bytes())
            }
            Operation::Statfs => {
                let statfs = StatfsOut {
                    blocks: 1000,
                    bfree: 500,
                    bavail: 400,
                    files: 100,
                    ffree: 90,
                    bsize: 4096,
                    namelen: 255,
                    frsize: 4096,
                };
                Reply::encode(|out| reply::statfs(out, unique, &statfs))
            }
            Operation::Release(_)
            | Operation::Releasedir(_)
            | Operation::Flush(_)
            | Operation::Fsync(_)
            | Operation::Fsyncdir(_) => Reply::empty(unique),
            Operation::Forget(_) | Operation::BatchForget(_) => Reply::none(),
            _ => Reply::error(unique, Errno::ENOSYS),
        }
    }
}

/// The children of `dir` from READDIR offset `offset` on: (index, ino, name, mode).
fn children(tree: &Tree, dir: u64, offset: u64) -> Vec<(u64, u64, OsString, u32)> {
    tree.nodes
        .iter()
        .filter(|&(&ino, n)| ino != 1 && n.parent == dir)
        .enumerate()
        .skip(offset as usize)
        .map(|(index, (&ino, n))| (index as u64, ino, n.name.clone(), n.mode))
        .collect()
}

fn attr_reply(unique: Unique, attr: Attr) -> Reply {
    let out = AttrOut {
        attr,
        ..AttrOut::default()
    };
    Reply::encode(|buf| reply::attr(buf, unique, &out))
}

impl Handler for MemFs {
    async fn handle<'a>(&'a self, context: RequestContext, request: Request<'a>) -> Reply {
        self.log.record(&request.header, &request.op);
        if let Operation::Lookup { name } = request.op
            && name == STUCK
            && let Some(reply) = self.hold(&context, request.header.unique).await
        {
            return reply;
        }
        self.serve(&request.header, request.op)
    }

    fn replied(&self, unique: Unique, opcode: Opcode, delivered: bool) {
        lock(&self.log.replied).push((opcode, unique, delivered));
    }
}
