//! Unit tests: one per edge case of the format, plus queries.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::{ErrorKind, Field, MountTable, OptionalField, roundtrip_check};

fn one(line: &[u8]) -> MountTable<'_> {
    let table = MountTable::parse(line).unwrap();
    assert_eq!(table.len(), 1);
    roundtrip_check(line);
    table
}

fn os(b: &[u8]) -> &OsStr {
    OsStr::from_bytes(b)
}

const SAMPLE: &[u8] =
    b"36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n";

#[test]
fn the_proc_rst_example_parses_field_by_field() {
    let table = one(SAMPLE);
    let m = &table.as_slice()[0];
    assert_eq!(
        (m.mount_id(), m.parent_id(), m.major(), m.minor()),
        (36, 35, 98, 0)
    );
    assert_eq!(m.root(), Path::new("/mnt1"));
    assert_eq!(m.mount_point(), Path::new("/mnt2"));
    assert_eq!(m.mount_options().as_bytes(), b"rw,noatime");
    assert_eq!(
        m.optional_fields().collect::<Vec<_>>(),
        [OptionalField::Master(1)]
    );
    assert_eq!(m.fs_type(), "ext3");
    assert_eq!(m.source(), "/dev/root");
    assert_eq!(m.super_options().value("errors"), Some(&b"continue"[..]));
    assert_eq!(m.master(), Some(1));
    assert_eq!(m.shared(), None);
    assert!(!m.is_read_only());
}

#[test]
fn empty_input_is_an_empty_table() {
    let table = MountTable::parse(b"").unwrap();
    assert!(table.is_empty());
    assert_eq!(table.render(), b"");
    roundtrip_check(b"");
}

#[test]
fn empty_source_is_an_empty_source() {
    let table = one(b"1 0 0:1 / / rw - tmpfs  rw,size=4k\n");
    let m = &table.as_slice()[0];
    assert_eq!(m.source(), "");
    assert_eq!(m.super_options().as_bytes(), b"rw,size=4k");
}

#[test]
fn source_that_is_literally_a_dash_works() {
    let table = one(b"1 0 0:1 / / rw - tmpfs - rw\n");
    assert_eq!(table.as_slice()[0].source(), "-");
    assert_eq!(table.as_slice()[0].fs_type(), "tmpfs");
}

#[test]
fn fs_type_that_is_a_dash_works() {
    let table = one(b"1 0 0:1 / / rw - - - rw\n");
    assert_eq!(table.as_slice()[0].fs_type(), "-");
    assert_eq!(table.as_slice()[0].source(), "-");
}

#[test]
fn dash_as_root_mount_point_or_options_is_not_the_separator() {
    let table = one(b"1 0 0:1 - - - shared:2 - ext4 /dev/x rw\n");
    let m = &table.as_slice()[0];
    assert_eq!(m.root(), Path::new("-"));
    assert_eq!(m.mount_point(), Path::new("-"));
    assert_eq!(m.mount_options().as_bytes(), b"-");
    assert_eq!(m.shared(), Some(2));
}

#[test]
fn super_options_containing_spaces_work() {
    let table = one(b"1 0 0:1 / /x rw - fuse.x src rw,opt=a b  c,user_id=0 \n");
    let opts = table.as_slice()[0].super_options();
    assert_eq!(opts.as_bytes(), b"rw,opt=a b  c,user_id=0 ");
    assert_eq!(opts.value("opt"), Some(&b"a b  c"[..]));
    assert_eq!(opts.value("user_id"), Some(&b"0 "[..]));
}

#[test]
fn empty_super_options_are_allowed_but_a_missing_field_is_not() {
    let table = one(b"1 0 0:1 / /x rw - tmpfs src \n");
    assert_eq!(table.as_slice()[0].super_options().as_bytes(), b"");
    let err = MountTable::parse(b"1 0 0:1 / /x rw - tmpfs src\n").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::MissingField(Field::SuperOptions));
}

#[test]
fn a_line_of_100_kib_works() {
    let long = "a".repeat(100 * 1024);
    let line = format!("1 0 0:1 / /{long} rw - tmpfs tmpfs rw\n");
    let table = one(line.as_bytes());
    assert_eq!(
        table.as_slice()[0].mount_point().as_os_str().len(),
        100 * 1024 + 1
    );
}

#[test]
fn path_escapes_are_decoded_and_borrowed_fields_stay_borrowed() {
    let input = b"1 0 0:1 /a\\040b\\011c\\012d\\134e /plain rw - tmpfs tmpfs rw\n";
    let table = one(input);
    let m = &table.as_slice()[0];
    assert_eq!(m.root().as_os_str(), os(b"/a b\tc\nd\\e"));
    assert!(matches!(m.root, std::borrow::Cow::Owned(_)));
    assert!(matches!(m.mount_point, std::borrow::Cow::Borrowed(_)));
    assert!(matches!(m.source, std::borrow::Cow::Borrowed(_)));
}

#[test]
fn hash_is_decoded_in_source_and_fs_type_only() {
    let input = b"1 0 0:1 /r\\043 /m\\043 rw - t\\043x s\\043rc rw\n";
    let table = MountTable::parse(input).unwrap();
    let m = &table.as_slice()[0];
    assert_eq!(m.source(), "s#rc");
    assert_eq!(m.fs_type(), "t#x");
    // The kernel never writes \043 in a path, so it stays a literal backslash sequence there.
    assert_eq!(m.root().as_os_str(), os(b"/r\\043"));
    assert_eq!(m.mount_point().as_os_str(), os(b"/m\\043"));
    assert_eq!(
        table.render(),
        b"1 0 0:1 /r\\134043 /m\\134043 rw - t\\043x s\\043rc rw\n".as_slice()
    );
    roundtrip_check(input);
}

#[test]
fn unescaped_hash_in_root_and_mount_point_survives_render_unchanged() {
    let input = b"1 0 0:1 /#r /mnt/#x#y rw - tmpfs tmpfs rw\n";
    let table = one(input);
    assert_eq!(table.as_slice()[0].mount_point(), Path::new("/mnt/#x#y"));
    assert_eq!(table.render(), input);
}

#[test]
fn unescaped_hash_in_source_is_accepted_and_rendered_escaped() {
    let table = MountTable::parse(b"1 0 0:1 / /m rw - tmpfs a#b rw\n").unwrap();
    assert_eq!(table.as_slice()[0].source(), "a#b");
    assert_eq!(table.render(), b"1 0 0:1 / /m rw - tmpfs a\\043b rw\n");
    assert!(!table.was_canonical());
    roundtrip_check(b"1 0 0:1 / /m rw - tmpfs a#b rw\n");
}

#[test]
fn backslash_that_starts_no_escape_is_kept_literally() {
    for root in [&b"/a\\"[..], b"/a\\04", b"/a\\999", b"/a\\101", b"/\\043"] {
        let input = [&b"1 0 0:1 "[..], root, b" /m rw - t s rw\n"].concat();
        let table = MountTable::parse(&input).unwrap();
        assert_eq!(table.as_slice()[0].root().as_os_str().as_bytes(), root);
        assert!(matches!(
            table.as_slice()[0].root,
            std::borrow::Cow::Borrowed(_)
        ));
        assert!(!table.was_canonical());
        roundtrip_check(&input);
    }
}

#[test]
fn non_utf8_bytes_pass_through() {
    let input = b"1 0 0:1 /\xff\xfe /m\xc3( rw - t\x80 s\x81 rw\xff\n";
    let table = one(input);
    let m = &table.as_slice()[0];
    assert_eq!(m.root().as_os_str().as_bytes(), b"/\xff\xfe");
    assert_eq!(m.source().as_bytes(), b"s\x81");
}

#[test]
fn all_known_and_unknown_optional_fields_are_kept_in_order() {
    let input =
        b"1 0 0:1 / / rw shared:1 master:2 propagate_from:3 unbindable future:x shared:007 - t s rw\n";
    let table = one(input);
    assert_eq!(
        table.as_slice()[0].optional_fields().collect::<Vec<_>>(),
        [
            OptionalField::Shared(1),
            OptionalField::Master(2),
            OptionalField::PropagateFrom(3),
            OptionalField::Unbindable,
            OptionalField::Unknown(b"future:x"),
            OptionalField::Unknown(b"shared:007"),
        ]
    );
}

#[test]
fn no_optional_fields_and_one_empty_optional_field_differ() {
    let none = one(b"1 0 0:1 / / rw - t s rw\n");
    assert_eq!(none.as_slice()[0].optional_fields().count(), 0);
    let empty = one(b"1 0 0:1 / / rw  - t s rw\n");
    assert_eq!(
        empty.as_slice()[0].optional_fields().collect::<Vec<_>>(),
        [OptionalField::Unknown(b"")]
    );
}

#[test]
fn the_separator_is_the_first_dash_after_the_optional_fields() {
    let table = one(b"1 0 0:1 / / rw shared:1 - - - rw - x\n");
    let m = &table.as_slice()[0];
    assert_eq!(m.fs_type(), "-");
    assert_eq!(m.source(), "-");
    assert_eq!(m.super_options().as_bytes(), b"rw - x");
}

#[test]
fn missing_final_newline_is_accepted() {
    let table = MountTable::parse(b"1 0 0:1 / / rw - t s rw").unwrap();
    assert_eq!(table.len(), 1);
    assert!(!table.was_canonical());
    roundtrip_check(b"1 0 0:1 / / rw - t s rw");
}

#[test]
fn errors_name_the_line_and_the_problem() {
    let cases: &[(&[u8], usize, ErrorKind)] = &[
        (b"\n", 1, ErrorKind::EmptyLine),
        (b"1 0 0:1 / / rw - t s rw\n\n", 2, ErrorKind::EmptyLine),
        (
            b"x 0 0:1 / / rw - t s rw\n",
            1,
            ErrorKind::InvalidNumber(Field::MountId),
        ),
        (
            b"01 0 0:1 / / rw - t s rw\n",
            1,
            ErrorKind::InvalidNumber(Field::MountId),
        ),
        (
            b"+1 0 0:1 / / rw - t s rw\n",
            1,
            ErrorKind::InvalidNumber(Field::MountId),
        ),
        (
            b"1 -1 0:1 / / rw - t s rw\n",
            1,
            ErrorKind::InvalidNumber(Field::ParentId),
        ),
        (
            b"1 0 01 / / rw - t s rw\n",
            1,
            ErrorKind::InvalidNumber(Field::Device),
        ),
        (
            b"1 0 0:4294967296 / / rw - t s rw\n",
            1,
            ErrorKind::InvalidNumber(Field::Device),
        ),
        (
            b"18446744073709551616 0 0:1 / / rw - t\n",
            1,
            ErrorKind::InvalidNumber(Field::MountId),
        ),
        (b"1", 1, ErrorKind::MissingField(Field::ParentId)),
        (b"1 0 0:1 /", 1, ErrorKind::MissingField(Field::MountPoint)),
        (
            b"1 0 0:1 / /",
            1,
            ErrorKind::MissingField(Field::MountOptions),
        ),
        (
            b"1 0 0:1 / / rw shared:1\n",
            1,
            ErrorKind::MissingField(Field::Separator),
        ),
        (
            b"1 0 0:1 / / rw -",
            1,
            ErrorKind::MissingField(Field::FsType),
        ),
        (
            b"1 0 0:1 / / rw - t",
            1,
            ErrorKind::MissingField(Field::Source),
        ),
    ];
    for (input, line, kind) in cases {
        let err = MountTable::parse(input).unwrap_err();
        assert_eq!(
            (err.line(), err.kind()),
            (*line, *kind),
            "{}",
            input.escape_ascii()
        );
        roundtrip_check(input);
    }
    let err = MountTable::parse(b"1 0 0:1 / / rw - t s rw\n1 0 0:1 / / rw\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "mountinfo line 2: missing `-` separator after the optional fields"
    );
}

#[test]
fn options_match_exact_names_only() {
    let table = one(b"1 0 0:1 / / ro,rootcontext=x,modes=1,mode=755,mode=700,e=,x - t s rw,,a\n");
    let m = &table.as_slice()[0];
    let opts = m.mount_options();
    assert!(opts.has_flag("ro"));
    assert!(!opts.has_flag("r"));
    assert!(!opts.has_flag("rootcontext"));
    assert_eq!(opts.value("mode"), Some(&b"700"[..]));
    assert_eq!(opts.value("mod"), None);
    assert_eq!(opts.value("e"), Some(&b""[..]));
    assert_eq!(opts.value("x"), None);
    assert_eq!(opts.flags().collect::<Vec<_>>(), [&b"ro"[..], b"x"]);
    assert!(m.is_read_only());
    assert_eq!(m.super_options().iter().count(), 2);
}

const TREE: &[u8] = b"\
20 1 8:1 / / rw shared:1 - ext4 /dev/sda1 rw
21 20 0:5 / /proc rw - proc proc rw
22 20 0:6 / /mnt rw - tmpfs tmpfs rw
23 22 0:7 / /mnt/a rw - tmpfs a rw
24 22 0:8 / /mnt/ab rw - tmpfs ab rw
25 23 8:1 /srv/data /mnt/a/b\\040c rw - ext4 /dev/sda1 rw
26 22 0:9 / /mnt/a rw - tmpfs over rw
27 99 0:10 / /outside rw - tmpfs o rw
28 28 0:11 / /self rw - tmpfs s rw
";

fn ids<'x>(it: impl Iterator<Item = &'x crate::Mount<'x>>) -> Vec<u64> {
    it.map(|m| m.mount_id()).collect()
}

#[test]
fn by_mount_point_takes_the_topmost_mount_and_compares_components() {
    let table = MountTable::parse(TREE).unwrap();
    assert_eq!(table.by_mount_point("/mnt/a").unwrap().mount_id(), 26);
    assert_eq!(table.by_mount_point("/mnt/a/").unwrap().mount_id(), 26);
    assert_eq!(table.by_mount_point("/mnt//a/.").unwrap().mount_id(), 26);
    assert_eq!(table.by_mount_point("/mnt/a/b c").unwrap().mount_id(), 25);
    assert!(table.by_mount_point("/mnt/a/b\\040c").is_none());
    assert!(table.by_mount_point("mnt/a").is_none());
    assert!(table.by_mount_point("/mnt/a/../a").is_none());
    assert!(table.is_mount_point("/"));
    assert!(!table.is_mount_point("/mnt/a/b"));
}

#[test]
fn a_mount_point_written_in_odd_form_still_matches() {
    let table = MountTable::parse(b"1 0 0:1 / /x//y/ rw - t s rw\n").unwrap();
    assert!(table.is_mount_point("/x/y"));
}

#[test]
fn mounts_at_or_below_never_match_a_string_prefix() {
    let table = MountTable::parse(TREE).unwrap();
    assert_eq!(ids(table.mounts_at_or_below("/mnt/a")), [23, 25, 26]);
    assert_eq!(ids(table.mounts_at_or_below("/mnt/a/")), [23, 25, 26]);
    assert_eq!(ids(table.mounts_at_or_below("/mnt")), [22, 23, 24, 25, 26]);
    assert_eq!(table.mounts_at_or_below("/").count(), 9);
}

#[test]
fn the_empty_path_and_relative_paths_match_nothing() {
    let table = MountTable::parse(TREE).unwrap();
    assert_eq!(table.mounts_at_or_below("").count(), 0);
    assert_eq!(table.mounts_at_or_below("mnt").count(), 0);
    assert!(table.containing("").is_none());
    assert!(table.by_mount_point("").is_none());
    assert!(!table.is_mount_point(""));
}

#[test]
fn containing_takes_the_longest_component_prefix_and_the_topmost_mount() {
    let table = MountTable::parse(TREE).unwrap();
    assert_eq!(table.containing("/mnt/a/x").unwrap().mount_id(), 26);
    assert_eq!(table.containing("/mnt/abc").unwrap().mount_id(), 22);
    assert_eq!(table.containing("/mnt/ab/c").unwrap().mount_id(), 24);
    assert_eq!(table.containing("/mnt/a/b c/d").unwrap().mount_id(), 25);
    assert_eq!(table.containing("/etc").unwrap().mount_id(), 20);
    assert!(table.containing("relative").is_none());
}

#[test]
fn source_fs_type_and_device_queries_are_exact() {
    let table = MountTable::parse(TREE).unwrap();
    assert_eq!(ids(table.by_source("/dev/sda1")), [20, 25]);
    assert_eq!(ids(table.by_source("/dev/sda")), Vec::<u64>::new());
    assert_eq!(ids(table.by_fs_type("tmpfs")), [22, 23, 24, 26, 27, 28]);
    assert_eq!(ids(table.by_fs_type("tmp")), Vec::<u64>::new());
    assert_eq!(ids(table.by_device_and_root(8, 1, "/srv/data")), [25]);
    assert_eq!(ids(table.by_device_and_root(8, 1, "/srv/data/")), [25]);
    assert_eq!(
        ids(table.by_device_and_root(8, 1, "/srv")),
        Vec::<u64>::new()
    );
    assert_eq!(ids(table.by_device_and_root(8, 2, "/")), Vec::<u64>::new());
}

#[test]
fn tree_queries_follow_ids() {
    let table = MountTable::parse(TREE).unwrap();
    let a = table.by_mount_id(23).unwrap();
    assert_eq!(a.mount_point(), Path::new("/mnt/a"));
    assert_eq!(table.parent(a).unwrap().mount_id(), 22);
    assert_eq!(ids(table.children(22)), [23, 24, 26]);
    assert_eq!(ids(table.children(23)), [25]);
    assert_eq!(ids(table.children(28)), Vec::<u64>::new());
    assert!(table.by_mount_id(1000).is_none());
    assert!(table.parent(table.by_mount_id(27).unwrap()).is_none());
    assert!(table.parent(table.by_mount_id(28).unwrap()).is_none());
    assert!(table.parent(table.by_mount_id(20).unwrap()).is_none());
}

#[test]
fn tree_round_trips() {
    roundtrip_check(TREE);
    assert_eq!(MountTable::parse(TREE).unwrap().render(), TREE);
}

#[test]
fn debug_output_is_readable() {
    let table = one(SAMPLE);
    let debug = format!("{table:?}");
    assert!(debug.contains("mount_point: \"/mnt2\""), "{debug}");
    assert!(debug.contains("\"rw,errors=continue\""), "{debug}");
}
