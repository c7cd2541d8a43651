//! Integration tests: property tests against generated kernel-form tables, a differential test
//! against a deliberately simple reference parser, the real table of this process, and
//! privileged tests with real mounts in a private mount namespace.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use proptest::prelude::*;
use tak_os_mountinfo::{MountTable, MountWatcher, OptionalField, roundtrip_check};

// ---------------------------------------------------------------------------------------------
// Generated tables in the kernel's form.

#[derive(Debug, Clone)]
enum Tag {
    Shared(u64),
    Master(u64),
    PropagateFrom(u64),
    Unbindable,
    Unknown(Vec<u8>),
}

#[derive(Debug, Clone)]
struct Line {
    mount_id: u64,
    parent_id: u64,
    major: u32,
    minor: u32,
    root: Vec<u8>,
    mount_point: Vec<u8>,
    mount_options: Vec<u8>,
    tags: Vec<Tag>,
    fs_type: Vec<u8>,
    source: Vec<u8>,
    super_options: Vec<u8>,
}

/// Bytes that need care, weighted so that every one shows up often.
fn tricky_byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        3 => prop::sample::select(b"/ \t\n\\#-:,=0134".to_vec()),
        1 => prop::sample::select(vec![0xffu8, 0xfe, 0x80, 0xc3, 0x00, b'\r']),
        2 => any::<u8>(),
        3 => prop::sample::select(b"abcxyz".to_vec()),
    ]
}

fn name() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(tricky_byte(), 0..24)
}

/// A field the kernel writes raw and that cannot hold a space or a newline.
fn word() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        tricky_byte().prop_filter("no space or newline", |b| *b != b' ' && *b != b'\n'),
        0..16,
    )
}

fn tag() -> impl Strategy<Value = Tag> {
    prop_oneof![
        any::<u64>().prop_map(Tag::Shared),
        any::<u64>().prop_map(Tag::Master),
        any::<u64>().prop_map(Tag::PropagateFrom),
        Just(Tag::Unbindable),
        // A prefix the parser does not know, so that the value survives as Unknown.
        word().prop_map(|w| Tag::Unknown([b"x-".as_slice(), &w].concat())),
    ]
}

prop_compose! {
    fn line()(
        ids in any::<(u64, u64, u32, u32)>(),
        root in name(),
        mount_point in name(),
        mount_options in word(),
        tags in prop::collection::vec(tag(), 0..4),
        fs_type in name(),
        source in name(),
        super_options in prop::collection::vec(tricky_byte().prop_filter("no newline", |b| *b != b'\n'), 0..24),
    ) -> Line {
        Line {
            mount_id: ids.0, parent_id: ids.1, major: ids.2, minor: ids.3,
            root, mount_point, mount_options, tags, fs_type, source, super_options,
        }
    }
}

/// The test's own encoder, written from proc.rst and fs/proc_namespace.c's escape sets.
fn kernel_escape(value: &[u8], hash: bool, out: &mut Vec<u8>) {
    for &b in value {
        match b {
            b' ' => out.extend_from_slice(b"\\040"),
            b'\t' => out.extend_from_slice(b"\\011"),
            b'\n' => out.extend_from_slice(b"\\012"),
            b'\\' => out.extend_from_slice(b"\\134"),
            b'#' if hash => out.extend_from_slice(b"\\043"),
            _ => out.push(b),
        }
    }
}

fn kernel_text(lines: &[Line]) -> Vec<u8> {
    let mut out = Vec::new();
    for l in lines {
        out.extend_from_slice(
            format!("{} {} {}:{} ", l.mount_id, l.parent_id, l.major, l.minor).as_bytes(),
        );
        kernel_escape(&l.root, false, &mut out);
        out.push(b' ');
        kernel_escape(&l.mount_point, false, &mut out);
        out.push(b' ');
        out.extend_from_slice(&l.mount_options);
        for t in &l.tags {
            out.push(b' ');
            match t {
                Tag::Shared(n) => out.extend_from_slice(format!("shared:{n}").as_bytes()),
                Tag::Master(n) => out.extend_from_slice(format!("master:{n}").as_bytes()),
                Tag::PropagateFrom(n) => {
                    out.extend_from_slice(format!("propagate_from:{n}").as_bytes())
                }
                Tag::Unbindable => out.extend_from_slice(b"unbindable"),
                Tag::Unknown(raw) => out.extend_from_slice(raw),
            }
        }
        out.extend_from_slice(b" - ");
        kernel_escape(&l.fs_type, true, &mut out);
        out.push(b' ');
        kernel_escape(&l.source, true, &mut out);
        out.push(b' ');
        out.extend_from_slice(&l.super_options);
        out.push(b'\n');
    }
    out
}

fn bytes(s: &OsStr) -> &[u8] {
    s.as_bytes()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn render_of_parse_is_the_identity_on_kernel_form_tables(lines in prop::collection::vec(line(), 0..12)) {
        let text = kernel_text(&lines);
        let table = MountTable::parse(&text).unwrap();
        prop_assert_eq!(table.render(), text.clone());
        roundtrip_check(&text);

        prop_assert_eq!(table.len(), lines.len());
        for (m, l) in table.iter().zip(&lines) {
            prop_assert_eq!((m.mount_id(), m.parent_id()), (l.mount_id, l.parent_id));
            prop_assert_eq!((m.major(), m.minor()), (l.major, l.minor));
            prop_assert_eq!(bytes(m.root().as_os_str()), &l.root[..]);
            prop_assert_eq!(bytes(m.mount_point().as_os_str()), &l.mount_point[..]);
            prop_assert_eq!(m.mount_options().as_bytes(), &l.mount_options[..]);
            prop_assert_eq!(bytes(m.fs_type()), &l.fs_type[..]);
            prop_assert_eq!(bytes(m.source()), &l.source[..]);
            prop_assert_eq!(m.super_options().as_bytes(), &l.super_options[..]);
            let tags: Vec<_> = m.optional_fields().collect();
            prop_assert_eq!(tags.len(), l.tags.len());
            for (got, want) in tags.iter().zip(&l.tags) {
                let same = match (got, want) {
                    (OptionalField::Shared(a), Tag::Shared(b))
                    | (OptionalField::Master(a), Tag::Master(b))
                    | (OptionalField::PropagateFrom(a), Tag::PropagateFrom(b)) => a == b,
                    (OptionalField::Unbindable, Tag::Unbindable) => true,
                    (OptionalField::Unknown(a), Tag::Unknown(b)) => a == &b.as_slice(),
                    _ => false,
                };
                prop_assert!(same, "{:?} vs {:?}", got, want);
            }
        }
    }

    #[test]
    fn every_generated_mount_point_is_found(lines in prop::collection::vec(line(), 1..8)) {
        let text = kernel_text(&lines);
        let table = MountTable::parse(&text).unwrap();
        for l in &lines {
            let path = Path::new(OsStr::from_bytes(&l.mount_point));
            // The kernel writes absolute mount points; a relative one (which only a
            // generated table holds) is never matched, as a relative query path is not.
            let absolute = path.is_absolute();
            prop_assert_eq!(table.by_mount_point(path).is_some(), absolute);
            prop_assert_eq!(table.mounts_at_or_below(path).count() >= 1, absolute);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The reference parser: slow, obvious, and written from proc.rst alone.

#[derive(Debug, PartialEq)]
struct RefMount {
    ids: (u64, u64, u32, u32),
    root: Vec<u8>,
    mount_point: Vec<u8>,
    mount_options: Vec<u8>,
    optional: Vec<Vec<u8>>,
    fs_type: Vec<u8>,
    source: Vec<u8>,
    super_options: Vec<u8>,
}

fn ref_number(field: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(field).ok()?;
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if text.len() > 1 && text.starts_with('0') {
        return None;
    }
    text.parse().ok()
}

fn ref_unescape(field: &[u8], hash: bool) -> Vec<u8> {
    let mut table: Vec<(&[u8], u8)> = vec![
        (b"\\040", b' '),
        (b"\\011", b'\t'),
        (b"\\012", b'\n'),
        (b"\\134", b'\\'),
    ];
    if hash {
        table.push((b"\\043", b'#'));
    }
    let mut out = Vec::new();
    let mut rest = field;
    'outer: while !rest.is_empty() {
        for (escape, byte) in &table {
            if rest.starts_with(escape) {
                out.push(*byte);
                rest = &rest[4..];
                continue 'outer;
            }
        }
        out.push(rest[0]);
        rest = &rest[1..];
    }
    out
}

fn ref_line(line: &[u8]) -> Option<RefMount> {
    let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    if fields.len() < 6 {
        return None;
    }
    let sep = (6..fields.len()).find(|&i| fields[i] == b"-")?;
    if fields.len() < sep + 4 {
        return None;
    }
    let dev: Vec<&[u8]> = fields[2].splitn(2, |&b| b == b':').collect();
    if dev.len() != 2 {
        return None;
    }
    Some(RefMount {
        ids: (
            ref_number(fields[0])?,
            ref_number(fields[1])?,
            u32::try_from(ref_number(dev[0])?).ok()?,
            u32::try_from(ref_number(dev[1])?).ok()?,
        ),
        root: ref_unescape(fields[3], false),
        mount_point: ref_unescape(fields[4], false),
        mount_options: fields[5].to_vec(),
        optional: fields[6..sep].iter().map(|f| f.to_vec()).collect(),
        fs_type: ref_unescape(fields[sep + 1], true),
        source: ref_unescape(fields[sep + 2], true),
        super_options: fields[sep + 3..].join(&b' '),
    })
}

/// The mounts, or the 1-based number of the first bad line.
fn reference(input: &[u8]) -> Result<Vec<RefMount>, usize> {
    let mut lines: Vec<&[u8]> = input.split(|&b| b == b'\n').collect();
    if lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines
        .iter()
        .enumerate()
        .map(|(i, l)| ref_line(l).ok_or(i + 1))
        .collect()
}

fn ours(input: &[u8]) -> Result<Vec<RefMount>, usize> {
    let table = MountTable::parse(input).map_err(|e| e.line())?;
    Ok(table
        .iter()
        .map(|m| {
            let mut optional = Vec::new();
            for f in m.optional_fields() {
                optional.push(match f {
                    OptionalField::Shared(n) => format!("shared:{n}").into_bytes(),
                    OptionalField::Master(n) => format!("master:{n}").into_bytes(),
                    OptionalField::PropagateFrom(n) => format!("propagate_from:{n}").into_bytes(),
                    OptionalField::Unbindable => b"unbindable".to_vec(),
                    OptionalField::Unknown(raw) => raw.to_vec(),
                });
            }
            RefMount {
                ids: (m.mount_id(), m.parent_id(), m.major(), m.minor()),
                root: bytes(m.root().as_os_str()).to_vec(),
                mount_point: bytes(m.mount_point().as_os_str()).to_vec(),
                mount_options: m.mount_options().as_bytes().to_vec(),
                optional,
                fs_type: bytes(m.fs_type()).to_vec(),
                source: bytes(m.source()).to_vec(),
                super_options: m.super_options().as_bytes().to_vec(),
            }
        })
        .collect())
}

/// Lines made of tokens that sit on the format's edges.
fn token_soup() -> impl Strategy<Value = Vec<u8>> {
    let token = prop::sample::select(vec![
        &b"1"[..],
        b"0",
        b"23",
        b"007",
        b"18446744073709551616",
        b"0:1",
        b"8:17",
        b":",
        b"/",
        b"/a",
        b"-",
        b"--",
        b"rw",
        b"shared:1",
        b"master:02",
        b"unbindable",
        b"\\040",
        b"\\043",
        b"\\134",
        b"\\",
        b"\\04",
        b"#",
        b"\t",
        b"\xff",
        b"",
        b"\n",
        b"tmpfs",
    ]);
    prop::collection::vec(token, 0..40).prop_map(|tokens| tokens.join(&b' '))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn agrees_with_the_reference_parser_on_kernel_form_tables(lines in prop::collection::vec(line(), 0..8)) {
        let text = kernel_text(&lines);
        prop_assert_eq!(ours(&text), reference(&text));
    }

    #[test]
    fn agrees_with_the_reference_parser_on_token_soup(text in token_soup()) {
        prop_assert_eq!(ours(&text), reference(&text));
        roundtrip_check(&text);
    }

    #[test]
    fn agrees_with_the_reference_parser_on_mutated_tables(
        lines in prop::collection::vec(line(), 1..4),
        edits in prop::collection::vec((any::<prop::sample::Index>(), tricky_byte()), 1..4),
    ) {
        let mut text = kernel_text(&lines);
        for (at, byte) in edits {
            let i = at.index(text.len());
            text[i] = byte;
        }
        prop_assert_eq!(ours(&text), reference(&text));
        roundtrip_check(&text);
    }

    #[test]
    fn arbitrary_bytes_never_panic(text in prop::collection::vec(any::<u8>(), 0..256)) {
        roundtrip_check(&text);
    }
}

// ---------------------------------------------------------------------------------------------
// The real table.

#[test]
fn the_real_table_of_this_process_parses_and_renders_unchanged() {
    let text = tak_os_mountinfo::read_self().unwrap();
    let table = MountTable::parse(&text).unwrap();
    assert!(!table.is_empty());
    assert!(
        table.render() == text,
        "the kernel's own table must be in kernel form"
    );
    roundtrip_check(&text);
    assert!(table.containing("/").is_some());
    assert!(table.containing("/proc/self").is_some());
    for m in &table {
        assert_eq!(
            table.by_mount_id(m.mount_id()).map(|x| x.mount_id()),
            Some(m.mount_id())
        );
    }

    let by_pid = tak_os_mountinfo::read_pid(std::process::id()).unwrap();
    MountTable::parse(&by_pid).unwrap();
}

#[test]
fn read_pid_of_a_missing_process_is_not_found() {
    // Above the kernel's pid_max limit (4194304), so it never exists.
    let err = tak_os_mountinfo::read_pid(u32::MAX).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
}

// ---------------------------------------------------------------------------------------------
// Privileged: real mounts, each test in its own private mount namespace.

fn tmpfs(source: &str, target: &Path) -> rustix::io::Result<()> {
    rustix::mount::mount(
        source,
        target,
        "tmpfs",
        rustix::mount::MountFlags::empty(),
        None,
    )
}

#[test]
fn real_mounts_with_escaped_names_are_found_by_their_decoded_names() {
    if !test_support::private_mount_namespace(
        "real_mounts_with_escaped_names_are_found_by_their_decoded_names",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join(OsStr::from_bytes(b"a b\tc\nd\\e#f-\xff"));
    std::fs::create_dir(&odd).unwrap();
    tmpfs("src#1 x\\y", &odd).unwrap();
    std::fs::create_dir(odd.join("sub")).unwrap();
    let bind = dir.path().join("bind");
    std::fs::create_dir(&bind).unwrap();
    rustix::mount::mount_bind(odd.join("sub"), &bind).unwrap();

    let text = tak_os_mountinfo::read_self().unwrap();
    let table = MountTable::parse(&text).unwrap();
    assert!(table.render() == text);
    let m = table
        .by_mount_point(&odd)
        .expect("the odd mount point is in the table");
    assert_eq!(m.source(), "src#1 x\\y");
    assert_eq!(m.fs_type(), "tmpfs");
    assert_eq!(m.root(), Path::new("/"));
    assert!(table.is_mount_point(&odd));
    assert!(!table.is_mount_point(dir.path()));

    let b = table.by_mount_point(&bind).unwrap();
    assert_eq!(b.root(), Path::new("/sub"));
    let origin: Vec<_> = table
        .by_device_and_root(b.major(), b.minor(), "/")
        .collect();
    assert_eq!(origin.len(), 1);
    assert_eq!(origin[0].mount_point(), odd);
    assert_eq!(
        table.containing(odd.join("sub/x")).unwrap().mount_id(),
        m.mount_id()
    );
    assert_eq!(table.mounts_at_or_below(dir.path()).count(), 2);
    test_support::detach_mounts_below(dir.path());
}

#[test]
fn watcher_wakes_on_a_mount_and_not_before() {
    if !test_support::private_mount_namespace("watcher_wakes_on_a_mount_and_not_before") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let watcher = MountWatcher::open_self().unwrap();
    assert!(!watcher.wait(Some(Duration::ZERO)).unwrap());
    assert!(!watcher.wait(Some(Duration::from_millis(20))).unwrap());

    let target = dir.path().to_path_buf();
    std::thread::scope(|s| {
        let mounter = s.spawn(|| {
            // The new thread shares the namespace only if spawned after unshare; it was.
            std::thread::sleep(Duration::from_millis(50));
            tmpfs("watched", &target).unwrap();
        });
        assert!(watcher.wait(Some(Duration::from_secs(10))).unwrap());
        mounter.join().unwrap();
    });
    // The change has been reported once; nothing else changed since.
    assert!(!watcher.wait(Some(Duration::from_millis(20))).unwrap());
    let text = tak_os_mountinfo::read_self().unwrap();
    assert!(MountTable::parse(&text).unwrap().is_mount_point(dir.path()));
    test_support::detach_mounts_below(dir.path());
}
