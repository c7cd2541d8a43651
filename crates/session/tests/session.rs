//! The session record files through the public API, for both access modes: lifecycle, every
//! refusal at either name, the two names conflicting, crash leftovers, the golden records of
//! format versions 1 and 2, and the fuzz seeds.
//!
//! Tests of another owner need root; without it they print `SKIPPED` and return, except when
//! `CI=true`, where they fail.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stderr,
    reason = "test helpers fail loudly; skipped tests say so on stderr"
)]

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tak_os_session::{
    AccessMode, CreateOutcome, Error, ErrorKind, MountEpoch, SessionFile, SessionIdentity,
    SessionRecord, render,
};

const EPOCH: MountEpoch = MountEpoch::from_bytes([0x42; 16]);
const RWO: AccessMode = AccessMode::ReadWriteOnce;
const RWX: AccessMode = AccessMode::ReadWriteMany;
const MODES: [AccessMode; 2] = [RWO, RWX];

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    staging: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_owned();
    Fixture {
        staging: root.join("globalmount"),
        _dir: dir,
        root,
    }
}

/// The other access mode.
fn other(mode: AccessMode) -> AccessMode {
    match mode {
        RWO => RWX,
        RWX => RWO,
    }
}

impl Fixture {
    fn file(&self) -> SessionFile {
        SessionFile::open(&self.staging).unwrap()
    }

    /// The record path of `mode`, spelled out here rather than asked of the library.
    fn record(&self, mode: AccessMode) -> PathBuf {
        self.root.join(match mode {
            RWO => "globalmount.rwo-session",
            RWX => "globalmount.rwx-session",
        })
    }

    fn temp(&self, mode: AccessMode) -> PathBuf {
        self.root.join(match mode {
            RWO => ".globalmount.rwo-session.tmp",
            RWX => ".globalmount.rwx-session.tmp",
        })
    }

    /// Writes `bytes` at `mode`'s record path with `permissions`, bypassing the library.
    fn plant(&self, mode: AccessMode, bytes: &[u8], permissions: u32) {
        let path = self.record(mode);
        fs::write(&path, bytes).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(permissions)).unwrap();
    }
}

/// One directory entry as far as a refused operation could change it.
#[derive(Debug, PartialEq, Eq)]
struct Entry {
    inode: u64,
    mode: u32,
    uid: u32,
    links: u64,
    len: u64,
    bytes: Option<Vec<u8>>,
    target: Option<PathBuf>,
}

/// Every entry of the fixture's directory, so a test can show an operation changed nothing.
/// Only regular files are read (a FIFO would block).
fn snapshot(fx: &Fixture) -> BTreeMap<OsString, Entry> {
    fs::read_dir(&fx.root)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            let meta = fs::symlink_metadata(entry.path()).unwrap();
            let snapshot = Entry {
                inode: meta.ino(),
                mode: meta.mode(),
                uid: meta.uid(),
                links: meta.nlink(),
                len: meta.len(),
                bytes: meta.is_file().then(|| fs::read(entry.path()).unwrap()),
                target: meta
                    .is_symlink()
                    .then(|| fs::read_link(entry.path()).unwrap()),
            };
            (entry.file_name(), snapshot)
        })
        .collect()
}

fn identity() -> SessionIdentity {
    SessionIdentity::new("vol-1", 7, "node-a")
}

fn endpoints() -> Vec<String> {
    vec![
        "https://w1.example:7443".to_owned(),
        "https://w2.example:7443".to_owned(),
    ]
}

fn rwo_record(epoch: MountEpoch) -> SessionRecord {
    SessionRecord::pending_rwo(identity(), endpoints(), epoch).unwrap()
}

fn rwx_record() -> SessionRecord {
    SessionRecord::pending_rwx(identity(), endpoints()).unwrap()
}

/// The test's pending record of `mode`; an RWO one holds [`EPOCH`].
fn record(mode: AccessMode) -> SessionRecord {
    match mode {
        RWO => rwo_record(EPOCH),
        RWX => rwx_record(),
    }
}

/// The epoch a caller of `mode` passes to `mark_stage_completed`.
fn epoch(mode: AccessMode) -> Option<MountEpoch> {
    record(mode).epoch()
}

/// The record of `mode` rendered, with `from` replaced by `to` in its text.
fn rendered_with(mode: AccessMode, from: &str, to: &str) -> Vec<u8> {
    let text = String::from_utf8(render(&record(mode))).unwrap();
    assert!(text.contains(from), "{text:?} lacks {from:?}");
    text.replace(from, to).into_bytes()
}

fn version_line(mode: AccessMode) -> &'static str {
    match mode {
        RWO => "\"format_version\": 1,",
        RWX => "\"format_version\": 2,",
    }
}

/// Whether a test that needs root can run; says `SKIPPED` when not, and fails in CI.
fn root_or_skip(test: &str) -> bool {
    test_support::requires_root(test, "it changes a file's owner")
}

/// Every error of a refused operation, with its sources, as one line.
fn chain(e: &Error) -> String {
    test_support::error_chain(e)
}

/// Every operation, for callers of both access modes, on the fixture's staging path.
fn every_operation(file: &SessionFile) -> Vec<(String, Result<(), Error>)> {
    let mut results = vec![("load".to_owned(), file.load(&identity()).map(drop))];
    for mode in MODES {
        results.push((
            format!("create_pending {mode}"),
            file.create_pending(&record(mode)).map(drop),
        ));
        results.push((
            format!("mark_stage_completed {mode}"),
            file.mark_stage_completed(&identity(), epoch(mode))
                .map(drop),
        ));
    }
    results.push(("remove".to_owned(), file.remove(&identity()).map(drop)));
    results
}

/// Runs every operation, for callers of both access modes, against what was planted at
/// `mode`'s record path, which must be refused with `kind`; checks each error names `problem`
/// and the planted path, and that the directory is left byte for byte as it was.
fn assert_refused_by_all(fx: &Fixture, mode: AccessMode, kind: ErrorKind, problem: &str) {
    let before = snapshot(fx);
    for (operation, result) in every_operation(&fx.file()) {
        let e = result.expect_err(&operation);
        assert_eq!(e.kind(), kind, "{mode}: {operation}: {e}");
        let text = chain(&e);
        assert!(
            text.contains(problem),
            "{mode}: {operation}: {text:?} lacks {problem:?}"
        );
        assert!(
            text.contains(&format!("{:?}", fx.record(mode))),
            "{mode}: {operation}: {text:?} lacks the record path"
        );
    }
    assert_eq!(
        snapshot(fx),
        before,
        "{mode}: the refused record was changed"
    );
}

#[test]
fn lifecycle_creates_marks_and_removes_durably() {
    for mode in MODES {
        let fx = fixture();
        let file = fx.file();
        assert_eq!(file.path().record(mode), fx.record(mode));
        assert_eq!(file.path().temp(mode), fx.temp(mode));
        assert_eq!(file.load(&identity()).unwrap(), None);

        assert_eq!(
            file.create_pending(&record(mode)).unwrap(),
            CreateOutcome::Created
        );
        let meta = fs::symlink_metadata(fx.record(mode)).unwrap();
        assert!(meta.is_file());
        assert_eq!(meta.mode() & 0o7777, 0o600);
        assert_eq!(meta.uid(), rustix::process::geteuid().as_raw());
        assert_eq!(meta.nlink(), 1);
        assert!(!fx.temp(mode).exists(), "no temp file is left behind");
        assert!(
            fs::symlink_metadata(fx.record(other(mode))).is_err(),
            "{mode}: only the record of its own access mode is written"
        );
        assert_eq!(fs::read(fx.record(mode)).unwrap(), render(&record(mode)));
        let loaded = file.load(&identity()).unwrap().unwrap();
        assert_eq!(loaded, record(mode));
        assert_eq!(loaded.access_mode(), mode);
        assert!(!loaded.stage_completed());

        let completed = file.mark_stage_completed(&identity(), epoch(mode)).unwrap();
        assert!(completed.stage_completed());
        assert_eq!(completed.epoch(), epoch(mode));
        assert_eq!(completed.access_mode(), mode);
        assert_eq!(file.load(&identity()).unwrap(), Some(completed.clone()));
        assert_eq!(
            fs::symlink_metadata(fx.record(mode)).unwrap().mode() & 0o7777,
            0o600
        );
        assert_eq!(fs::read(fx.record(mode)).unwrap(), render(&completed));

        // Marking again writes nothing: the same inode stays in place.
        let inode = fs::symlink_metadata(fx.record(mode)).unwrap().ino();
        assert_eq!(
            file.mark_stage_completed(&identity(), epoch(mode)).unwrap(),
            completed
        );
        assert_eq!(fs::symlink_metadata(fx.record(mode)).unwrap().ino(), inode);

        assert!(file.remove(&identity()).unwrap());
        assert!(!fx.record(mode).exists());
        assert!(!file.remove(&identity()).unwrap());
        assert_eq!(file.load(&identity()).unwrap(), None);
        // The staging path itself was never created or looked at.
        assert!(fs::symlink_metadata(&fx.staging).is_err());
        assert_eq!(snapshot(&fx), BTreeMap::new(), "{mode}: nothing is left");
    }
}

#[test]
fn rwx_record_is_written_as_version_2_without_an_epoch() {
    let fx = fixture();
    let file = fx.file();
    assert_eq!(
        file.create_pending(&rwx_record()).unwrap(),
        CreateOutcome::Created
    );
    let text = fs::read_to_string(fx.record(RWX)).unwrap();
    assert!(text.contains("\"format_version\": 2,"), "{text}");
    assert!(text.contains("\"access_mode\": \"rwx\","), "{text}");
    assert!(!text.contains("epoch"), "{text}");
}

#[test]
fn create_pending_resumes_an_existing_session_of_the_same_identity() {
    let fx = fixture();
    let file = fx.file();
    assert_eq!(
        file.create_pending(&rwo_record(EPOCH)).unwrap(),
        CreateOutcome::Created
    );
    let retry = rwo_record(MountEpoch::from_bytes([7; 16]));
    assert_eq!(
        file.create_pending(&retry).unwrap(),
        CreateOutcome::Existing(rwo_record(EPOCH))
    );
    let completed = file.mark_stage_completed(&identity(), Some(EPOCH)).unwrap();
    assert_eq!(
        file.create_pending(&retry).unwrap(),
        CreateOutcome::Existing(completed)
    );
}

#[test]
fn create_pending_resumes_an_existing_rwx_session() {
    let fx = fixture();
    let file = fx.file();
    assert_eq!(
        file.create_pending(&rwx_record()).unwrap(),
        CreateOutcome::Created
    );
    // A retry with another endpoint set resumes the first attempt's endpoints.
    let retry =
        SessionRecord::pending_rwx(identity(), vec!["https://w3.example:7443".to_owned()]).unwrap();
    assert_eq!(
        file.create_pending(&retry).unwrap(),
        CreateOutcome::Existing(rwx_record())
    );
    let completed = file.mark_stage_completed(&identity(), None).unwrap();
    assert_eq!(
        file.create_pending(&retry).unwrap(),
        CreateOutcome::Existing(completed)
    );
}

#[test]
fn create_pending_refuses_a_record_of_another_identity() {
    for (existing_mode, mode) in [(RWO, RWO), (RWX, RWX), (RWO, RWX), (RWX, RWO)] {
        let fx = fixture();
        let file = fx.file();
        let stale = SessionIdentity::new("vol-1", 6, "node-a");
        let existing = match existing_mode {
            RWO => SessionRecord::pending_rwo(stale, endpoints(), EPOCH),
            RWX => SessionRecord::pending_rwx(stale, endpoints()),
        }
        .unwrap();
        assert_eq!(
            file.create_pending(&existing).unwrap(),
            CreateOutcome::Created
        );
        let before = snapshot(&fx);
        // Another identity is reported before another access mode.
        let e = file.create_pending(&record(mode)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::IdentityMismatch);
        assert_eq!(
            e.to_string(),
            format!(
                "session record {:?} names volume_generation 6, not 7",
                fx.record(existing_mode)
            )
        );
        assert_eq!(snapshot(&fx), before);
    }
}

#[test]
fn create_pending_of_the_other_access_mode_is_refused_and_changes_nothing() {
    for existing in MODES {
        for completed in [false, true] {
            let fx = fixture();
            let file = fx.file();
            assert_eq!(
                file.create_pending(&record(existing)).unwrap(),
                CreateOutcome::Created
            );
            if completed {
                file.mark_stage_completed(&identity(), epoch(existing))
                    .unwrap();
            }
            let before = snapshot(&fx);
            let requested = other(existing);
            let e = file.create_pending(&record(requested)).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Incompatible, "{e}");
            assert!(
                matches!(e, Error::AccessModeMismatch { found, expected, .. }
                    if found == existing && expected == requested),
                "{e}"
            );
            assert_eq!(
                e.to_string(),
                format!(
                    "session record {:?} is for access mode {existing}, not {requested}",
                    fx.record(existing)
                )
            );
            assert_eq!(
                snapshot(&fx),
                before,
                "the existing record is unchanged and no {requested} record is written"
            );
            assert!(fs::symlink_metadata(fx.record(requested)).is_err());
            assert!(fs::symlink_metadata(fx.temp(requested)).is_err());
            let loaded = file.load(&identity()).unwrap().unwrap();
            assert_eq!(loaded.access_mode(), existing);
            assert_eq!(loaded.stage_completed(), completed);
        }
    }
}

#[test]
fn mark_stage_completed_of_the_other_access_mode_is_refused() {
    for existing in MODES {
        let fx = fixture();
        let file = fx.file();
        assert_eq!(
            file.create_pending(&record(existing)).unwrap(),
            CreateOutcome::Created
        );
        let before = snapshot(&fx);
        let e = file
            .mark_stage_completed(&identity(), epoch(other(existing)))
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Incompatible, "{e}");
        assert!(
            e.to_string().ends_with(&format!(
                "is for access mode {existing}, not {}",
                other(existing)
            )),
            "{e}"
        );
        assert_eq!(snapshot(&fx), before);
        assert!(!file.load(&identity()).unwrap().unwrap().stage_completed());
    }
}

#[test]
fn both_records_present_is_refused_by_every_operation_and_changes_nothing() {
    let fx = fixture();
    fx.plant(RWO, &render(&record(RWO)), 0o600);
    fx.plant(RWX, &render(&record(RWX)), 0o600);
    let before = snapshot(&fx);
    let file = fx.file();
    let expected = format!(
        "session records {:?} and {:?} both exist; a staging path has at most one, so neither is trusted",
        fx.record(RWO),
        fx.record(RWX)
    );
    for (operation, result) in every_operation(&file) {
        let e = result.expect_err(&operation);
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{operation}: {e}");
        assert!(matches!(e, Error::ConflictingRecords { .. }), "{e}");
        assert_eq!(e.to_string(), expected, "{operation}");
    }
    assert_eq!(snapshot(&fx), before, "both records are left as they were");

    // What the records hold does not matter: two names is a conflict before any is parsed.
    let fx = fixture();
    fx.plant(RWO, b"garbage", 0o600);
    fx.plant(RWX, &render(&record(RWX)), 0o600);
    let e = fx.file().load(&identity()).unwrap_err();
    assert!(matches!(e, Error::ConflictingRecords { .. }), "{e}");
}

#[test]
fn record_under_the_other_access_modes_name_is_refused() {
    for mode in MODES {
        let fx = fixture();
        fx.plant(mode, &render(&record(other(mode))), 0o600);
        assert_refused_by_all(
            &fx,
            mode,
            ErrorKind::Corrupt,
            &format!(
                "holds an {} record; its name is for {mode} records",
                other(mode)
            ),
        );
    }
}

#[test]
fn mismatched_identity_is_refused_naming_the_field() {
    let cases = [
        (
            SessionIdentity::new("vol-2", 7, "node-a"),
            "names volume_id \"vol-1\", not \"vol-2\"",
        ),
        (
            SessionIdentity::new("vol-1", 8, "node-a"),
            "names volume_generation 7, not 8",
        ),
        (
            SessionIdentity::new("vol-1", 7, "node-b"),
            "names node_id \"node-a\", not \"node-b\"",
        ),
    ];
    for mode in MODES {
        for (expected, problem) in &cases {
            let fx = fixture();
            let file = fx.file();
            assert_eq!(
                file.create_pending(&record(mode)).unwrap(),
                CreateOutcome::Created
            );
            let before = snapshot(&fx);
            for result in [
                file.load(expected).map(drop),
                file.mark_stage_completed(expected, epoch(mode)).map(drop),
                file.remove(expected).map(drop),
            ] {
                let e = result.unwrap_err();
                assert_eq!(e.kind(), ErrorKind::IdentityMismatch);
                assert!(e.to_string().contains(problem), "{e}");
                assert!(
                    e.to_string().contains(&format!("{:?}", fx.record(mode))),
                    "{e}"
                );
            }
            assert_eq!(snapshot(&fx), before);
            assert_eq!(file.load(&identity()).unwrap(), Some(record(mode)));
        }
    }
}

#[test]
fn mark_stage_completed_refuses_another_claims_epoch_and_a_missing_record() {
    let fx = fixture();
    let file = fx.file();
    for mode in MODES {
        let e = file
            .mark_stage_completed(&identity(), epoch(mode))
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert_eq!(
            e.to_string(),
            format!("session record {:?} does not exist", fx.record(mode))
        );
    }

    assert_eq!(
        file.create_pending(&rwo_record(EPOCH)).unwrap(),
        CreateOutcome::Created
    );
    let other = MountEpoch::from_bytes([1; 16]);
    let e = file
        .mark_stage_completed(&identity(), Some(other))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IdentityMismatch);
    assert!(
        e.to_string()
            .ends_with(&format!("holds mount epoch {EPOCH}, not {other}")),
        "{e}"
    );
    assert!(!file.load(&identity()).unwrap().unwrap().stage_completed());
}

#[test]
fn symlink_at_the_record_path_is_never_followed() {
    for mode in MODES {
        let fx = fixture();
        // The target is a valid record owned by us: following it would succeed.
        let target = fx.root.join("elsewhere");
        fs::write(&target, render(&record(mode))).unwrap();
        fs::set_permissions(&target, fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&target, fx.record(mode)).unwrap();

        assert_refused_by_all(
            &fx,
            mode,
            ErrorKind::Unsafe,
            "is a symlink; refusing to follow it",
        );
        assert!(fs::symlink_metadata(fx.record(mode)).unwrap().is_symlink());
        assert_eq!(fs::read_link(fx.record(mode)).unwrap(), target);
        assert_eq!(fs::read(&target).unwrap(), render(&record(mode)));
        assert_eq!(fs::metadata(&target).unwrap().mode() & 0o7777, 0o600);
    }
}

#[test]
fn dangling_symlink_at_the_record_path_is_not_created_through() {
    for mode in MODES {
        for requested in MODES {
            let fx = fixture();
            let target = fx.root.join("missing");
            std::os::unix::fs::symlink(&target, fx.record(mode)).unwrap();
            let e = fx.file().create_pending(&record(requested)).unwrap_err();
            assert!(
                matches!(e, Error::Symlink { ref path } if *path == fx.record(mode)),
                "{e}"
            );
            assert!(!target.exists());
            assert!(fs::symlink_metadata(fx.record(mode)).unwrap().is_symlink());
            assert!(fs::symlink_metadata(fx.record(other(mode))).is_err());
        }
    }
}

#[test]
fn record_of_another_owner_is_refused() {
    if !root_or_skip("record_of_another_owner_is_refused") {
        return;
    }
    for mode in MODES {
        let fx = fixture();
        fx.plant(mode, &render(&record(mode)), 0o600);
        std::os::unix::fs::chown(fx.record(mode), Some(1), None).unwrap();
        assert_refused_by_all(
            &fx,
            mode,
            ErrorKind::Unsafe,
            "is owned by uid 1, not by this process's uid 0",
        );
    }
}

#[test]
fn record_with_a_wider_mode_is_refused() {
    for mode in MODES {
        for (permissions, shown) in [
            (0o644, "mode 0644"),
            (0o640, "mode 0640"),
            (0o604, "mode 0604"),
            (0o700, "mode 0700"),
            (0o4600, "mode 4600"),
        ] {
            let fx = fixture();
            fx.plant(mode, &render(&record(mode)), permissions);
            assert_refused_by_all(&fx, mode, ErrorKind::Unsafe, shown);
            assert!(
                chain(&fx.file().load(&identity()).unwrap_err())
                    .contains("must be 0600 or narrower")
            );
        }
    }
}

#[test]
fn record_with_a_narrower_mode_is_accepted() {
    for mode in MODES {
        let fx = fixture();
        fx.plant(mode, &render(&record(mode)), 0o400);
        assert_eq!(fx.file().load(&identity()).unwrap(), Some(record(mode)));
    }
}

#[test]
fn record_with_another_hard_link_is_refused() {
    for mode in MODES {
        let fx = fixture();
        fx.plant(mode, &render(&record(mode)), 0o600);
        fs::hard_link(fx.record(mode), fx.root.join("second-name")).unwrap();
        assert_refused_by_all(&fx, mode, ErrorKind::Unsafe, "has 2 hard links; expected 1");
    }
}

#[test]
fn record_that_is_not_a_regular_file_is_refused() {
    for mode in MODES {
        let fx = fixture();
        fs::create_dir(fx.record(mode)).unwrap();
        assert_refused_by_all(&fx, mode, ErrorKind::Unsafe, "is not a regular file");

        let fx = fixture();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            fx.record(mode),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        // A FIFO is never opened, so nothing waits for a writer.
        let e = fx.file().load(&identity()).unwrap_err();
        assert!(matches!(e, Error::NotRegularFile { .. }), "{e}");
    }
}

#[test]
fn record_with_an_unknown_format_version_is_refused() {
    for mode in MODES {
        let fx = fixture();
        let bytes = rendered_with(
            mode,
            version_line(mode),
            "\"format_version\": 3, \"new_field\": true,",
        );
        fx.plant(mode, &bytes, 0o600);
        assert_refused_by_all(
            &fx,
            mode,
            ErrorKind::Corrupt,
            "has unknown format version 3; this library reads versions 1 to 2",
        );
    }
}

#[test]
fn rwo_record_without_an_epoch_and_rwx_record_with_one_are_refused() {
    let fx = fixture();
    let text = String::from_utf8(render(&record(RWO))).unwrap();
    let without = text.replace(&format!("  \"epoch\": \"{EPOCH}\",\n"), "");
    assert_ne!(without, text);
    fx.plant(RWO, without.as_bytes(), 0o600);
    assert_refused_by_all(
        &fx,
        RWO,
        ErrorKind::Corrupt,
        "has access mode rwo but no epoch",
    );

    let fx = fixture();
    let bytes = rendered_with(
        RWX,
        "\"stage_completed\"",
        &format!("\"epoch\": \"{EPOCH}\", \"stage_completed\""),
    );
    fx.plant(RWX, &bytes, 0o600);
    assert_refused_by_all(
        &fx,
        RWX,
        ErrorKind::Corrupt,
        "has access mode rwx and an epoch; an rwx session has no lease",
    );

    let fx = fixture();
    let bytes = rendered_with(RWX, version_line(RWX), "\"format_version\": 1,");
    fx.plant(RWX, &bytes, 0o600);
    assert_refused_by_all(
        &fx,
        RWX,
        ErrorKind::Corrupt,
        "has access mode rwx, which format version 1 does not have",
    );
}

#[test]
fn garbage_is_refused_as_malformed() {
    for mode in MODES {
        let fx = fixture();
        fx.plant(mode, b"\x7fELF\x02\x01\x01 not a record", 0o600);
        assert_refused_by_all(&fx, mode, ErrorKind::Corrupt, "malformed session record");
        assert!(chain(&fx.file().load(&identity()).unwrap_err()).contains("is not a JSON object"));

        let fx = fixture();
        fx.plant(
            mode,
            b"{\"format_version\": 1, \"volume_id\": \"vol-",
            0o600,
        );
        assert_refused_by_all(&fx, mode, ErrorKind::Corrupt, "is not valid JSON");
    }
}

#[test]
fn unknown_field_is_refused_so_no_secret_can_hide_in_a_record() {
    for (mode, version) in [(RWO, 1), (RWX, 2)] {
        let fx = fixture();
        let bytes = rendered_with(
            mode,
            "\"stage_completed\": false",
            "\"stage_completed\": false, \"bearer_token\": \"abc\"",
        );
        fx.plant(mode, &bytes, 0o600);
        assert_refused_by_all(
            &fx,
            mode,
            ErrorKind::Corrupt,
            "unknown field `bearer_token`",
        );
        let text = chain(&fx.file().load(&identity()).unwrap_err());
        assert!(
            text.contains(&format!("does not match format version {version}")),
            "{text}"
        );
        assert!(!text.contains("abc"), "{text}");
    }
}

#[test]
fn oversized_record_is_refused_before_reading() {
    for mode in MODES {
        let fx = fixture();
        let mut bytes = render(&record(mode));
        bytes.resize(tak_os_session::MAX_RECORD_BYTES as usize + 1, b' ');
        fx.plant(mode, &bytes, 0o600);
        assert_refused_by_all(
            &fx,
            mode,
            ErrorKind::Corrupt,
            "is 65537 bytes; the limit is 65536",
        );
    }
}

#[test]
fn unsafe_directories_are_refused() {
    let fx = fixture();
    let real = fx.root.join("real");
    fs::create_dir(&real).unwrap();
    let link = fx.root.join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let e = SessionFile::open(&link.join("globalmount")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsafe);
    assert_eq!(
        e.to_string(),
        format!("unsafe session directory {link:?}: is a symlink")
    );

    fs::set_permissions(&real, fs::Permissions::from_mode(0o777)).unwrap();
    let e = SessionFile::open(&real.join("globalmount")).unwrap_err();
    assert!(
        e.to_string()
            .ends_with("has mode 0777; it must not be writable by group or others"),
        "{e}"
    );

    let file = fx.root.join("file");
    fs::write(&file, b"").unwrap();
    let e = SessionFile::open(&file.join("globalmount")).unwrap_err();
    assert!(e.to_string().ends_with("is not a directory"), "{e}");

    let e = SessionFile::open(Path::new("relative/globalmount")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);

    if root_or_skip("unsafe_directories_are_refused (foreign owner)") {
        let foreign = fx.root.join("foreign");
        fs::create_dir(&foreign).unwrap();
        std::os::unix::fs::chown(&foreign, Some(1), None).unwrap();
        let e = SessionFile::open(&foreign.join("globalmount")).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("is owned by uid 1, not by root or this process's uid 0"),
            "{e}"
        );
    }
}

#[test]
fn stale_temp_file_is_ignored_then_cleaned() {
    for mode in MODES {
        let fx = fixture();
        let file = fx.file();
        // A crash after the temp file was written, before the rename: the claim was never sent.
        fs::write(fx.temp(mode), render(&record(mode))).unwrap();
        assert_eq!(file.load(&identity()).unwrap(), None);
        assert!(!file.remove(&identity()).unwrap());
        assert!(!fx.temp(mode).exists());

        // A torn temp file is replaced by the next write.
        fs::write(fx.temp(mode), b"{\"format_ver").unwrap();
        assert_eq!(file.load(&identity()).unwrap(), None);
        assert_eq!(
            file.create_pending(&record(mode)).unwrap(),
            CreateOutcome::Created
        );
        assert!(!fx.temp(mode).exists());
        assert_eq!(file.load(&identity()).unwrap(), Some(record(mode)));

        // A leftover beside an existing record is ignored by load and cleaned by the next
        // write; `remove` cleans the leftovers of both names.
        fs::write(fx.temp(mode), b"garbage").unwrap();
        assert_eq!(file.load(&identity()).unwrap(), Some(record(mode)));
        file.mark_stage_completed(&identity(), epoch(mode)).unwrap();
        assert!(!fx.temp(mode).exists());
        fs::write(fx.temp(mode), b"garbage").unwrap();
        fs::write(fx.temp(other(mode)), b"garbage").unwrap();
        assert!(file.remove(&identity()).unwrap());
        assert_eq!(snapshot(&fx), BTreeMap::new());
    }
}

#[test]
fn symlink_at_the_temp_path_is_removed_not_written_through() {
    for mode in MODES {
        let fx = fixture();
        let victim = fx.root.join("victim");
        fs::write(&victim, b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, fx.temp(mode)).unwrap();
        assert_eq!(
            fx.file().create_pending(&record(mode)).unwrap(),
            CreateOutcome::Created
        );
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        assert!(fs::symlink_metadata(fx.temp(mode)).is_err());
        assert!(fs::symlink_metadata(fx.record(mode)).unwrap().is_file());
    }
}

fn golden(name: &str) -> Vec<u8> {
    fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(name),
    )
    .unwrap()
}

fn golden_identity() -> SessionIdentity {
    SessionIdentity::new("pvc-6f1c2a9e-3b7d-4e2a-9c51-0d8e7f6a5b4c", 3, "node-a")
}

const GOLDEN_ENDPOINTS: [&str; 3] = [
    "https://worker-0.tak-os.svc:7443",
    "https://worker-1.tak-os.svc:7443",
    "https://[fd00::12]:7443",
];

#[test]
fn format_version_1_golden_record_reads_back_as_rwo() {
    let golden = golden("record-v1.json");
    let fx = fixture();
    fx.plant(RWO, &golden, 0o600);
    let record = fx.file().load(&golden_identity()).unwrap().unwrap();
    assert_eq!(record.identity(), &golden_identity());
    assert_eq!(record.endpoints(), GOLDEN_ENDPOINTS);
    assert_eq!(record.access_mode(), RWO);
    assert_eq!(
        record.epoch().unwrap().to_string(),
        "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
    );
    assert!(record.stage_completed());
    // RWO records are still written as version 1, byte for byte as the version-1 library did,
    // so an owner rolled back to it reads what this one writes.
    assert_eq!(render(&record), golden);
}

#[test]
fn format_version_2_golden_rwx_record_reads_back() {
    let golden = golden("record-v2-rwx.json");
    let fx = fixture();
    fx.plant(RWX, &golden, 0o600);
    let file = fx.file();
    let record = file.load(&golden_identity()).unwrap().unwrap();
    assert_eq!(record.identity(), &golden_identity());
    assert_eq!(record.endpoints(), GOLDEN_ENDPOINTS);
    assert_eq!(record.access_mode(), RWX);
    assert_eq!(record.epoch(), None);
    assert!(record.stage_completed());
    assert_eq!(render(&record), golden);
    assert!(file.remove(&golden_identity()).unwrap());
}

#[test]
fn version_2_rwo_record_is_read_and_rewritten_as_version_1() {
    let fx = fixture();
    let v2 = rendered_with(RWO, "\"format_version\": 1,", "\"format_version\": 2,");
    fx.plant(RWO, &v2, 0o600);
    let file = fx.file();
    assert_eq!(file.load(&identity()).unwrap(), Some(record(RWO)));
    let completed = file.mark_stage_completed(&identity(), Some(EPOCH)).unwrap();
    let text = fs::read_to_string(fx.record(RWO)).unwrap();
    assert!(text.contains("\"format_version\": 1,"), "{text}");
    assert_eq!(text.as_bytes(), render(&completed));
}

#[test]
fn fuzz_seeds_hold_the_roundtrip_invariant() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/session_record_parse");
    let mut seen = 0;
    let mut valid = BTreeMap::new();
    for entry in fs::read_dir(&dir).unwrap() {
        let bytes = fs::read(entry.unwrap().path()).unwrap();
        tak_os_session::roundtrip_check(&bytes);
        if let Ok(record) = tak_os_session::parse(&bytes) {
            *valid.entry(record.access_mode().to_string()).or_insert(0) += 1;
        }
        seen += 1;
    }
    assert!(seen >= 5, "expected the seed corpus in {}", dir.display());
    assert!(
        valid.contains_key("rwo") && valid.contains_key("rwx"),
        "the seeds hold a valid record of each access mode: {valid:?}"
    );
}
