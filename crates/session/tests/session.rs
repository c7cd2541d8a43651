//! The session record file through the public API: lifecycle, every refusal, crash leftovers,
//! the format-version-1 golden record and the fuzz seeds.
//!
//! Tests of another owner need root; without it they print `SKIPPED` and return, except when
//! `CI=true`, where they fail.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stderr,
    reason = "test helpers fail loudly; skipped tests say so on stderr"
)]

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tak_os_session::{
    CreateOutcome, Error, ErrorKind, MountEpoch, SessionFile, SessionIdentity, SessionRecord,
};

const EPOCH: MountEpoch = MountEpoch::from_bytes([0x42; 16]);

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    staging: PathBuf,
    record: PathBuf,
    temp: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_owned();
    let staging = root.join("globalmount");
    Fixture {
        record: root.join("globalmount.rwo-session"),
        temp: root.join(".globalmount.rwo-session.tmp"),
        _dir: dir,
        root,
        staging,
    }
}

impl Fixture {
    fn file(&self) -> SessionFile {
        SessionFile::open(&self.staging).unwrap()
    }

    /// Writes `bytes` at the record path with `mode`, bypassing the library.
    fn plant(&self, bytes: &[u8], mode: u32) {
        fs::write(&self.record, bytes).unwrap();
        fs::set_permissions(&self.record, fs::Permissions::from_mode(mode)).unwrap();
    }
}

fn identity() -> SessionIdentity {
    SessionIdentity::new("vol-1", 7, "node-a")
}

fn record(epoch: MountEpoch) -> SessionRecord {
    SessionRecord::pending(
        identity(),
        vec![
            "https://w1.example:7443".to_owned(),
            "https://w2.example:7443".to_owned(),
        ],
        epoch,
    )
    .unwrap()
}

/// Whether a test that needs root can run; says `SKIPPED` when not, and fails in CI.
fn root_or_skip(test: &str) -> bool {
    test_support::requires_root(test, "it changes a file's owner")
}

/// Every error of a refused operation, with its sources, as one line.
fn chain(e: &Error) -> String {
    test_support::error_chain(e)
}

/// Runs every operation against a planted record that must be refused with `kind`, checking
/// each error names `problem`, and that the record is left byte for byte as it was.
fn assert_refused_by_all(fx: &Fixture, kind: ErrorKind, problem: &str) {
    let before = fs::symlink_metadata(&fx.record).unwrap();
    let bytes = fs::read(&fx.record).ok();
    let file = fx.file();
    let results = [
        ("load", file.load(&identity()).map(drop)),
        (
            "create_pending",
            file.create_pending(&record(EPOCH)).map(drop),
        ),
        (
            "mark_stage_completed",
            file.mark_stage_completed(&identity(), EPOCH).map(drop),
        ),
        ("remove", file.remove(&identity()).map(drop)),
    ];
    for (operation, result) in results {
        let e = result.expect_err(operation);
        assert_eq!(e.kind(), kind, "{operation}: {e}");
        let text = chain(&e);
        assert!(
            text.contains(problem),
            "{operation}: {text:?} lacks {problem:?}"
        );
        assert!(
            text.contains(&format!("{:?}", fx.record)),
            "{operation}: {text:?} lacks the record path"
        );
    }
    let after = fs::symlink_metadata(&fx.record).unwrap();
    assert_eq!(
        (after.ino(), after.mode(), after.uid(), after.len()),
        (before.ino(), before.mode(), before.uid(), before.len()),
        "the refused record was changed"
    );
    assert_eq!(
        fs::read(&fx.record).ok(),
        bytes,
        "the refused record was changed"
    );
}

#[test]
fn lifecycle_creates_marks_and_removes_durably() {
    let fx = fixture();
    let file = fx.file();
    assert_eq!(file.path().record(), fx.record);
    assert_eq!(file.load(&identity()).unwrap(), None);

    assert_eq!(
        file.create_pending(&record(EPOCH)).unwrap(),
        CreateOutcome::Created
    );
    let meta = fs::symlink_metadata(&fx.record).unwrap();
    assert!(meta.is_file());
    assert_eq!(meta.mode() & 0o7777, 0o600);
    assert_eq!(meta.uid(), rustix::process::geteuid().as_raw());
    assert_eq!(meta.nlink(), 1);
    assert!(!fx.temp.exists(), "no temp file is left behind");
    assert_eq!(
        fs::read(&fx.record).unwrap(),
        tak_os_session::render(&record(EPOCH))
    );
    let loaded = file.load(&identity()).unwrap().unwrap();
    assert_eq!(loaded, record(EPOCH));
    assert!(!loaded.stage_completed());

    let completed = file.mark_stage_completed(&identity(), EPOCH).unwrap();
    assert!(completed.stage_completed());
    assert_eq!(completed.epoch(), EPOCH);
    assert_eq!(file.load(&identity()).unwrap(), Some(completed.clone()));
    assert_eq!(
        fs::symlink_metadata(&fx.record).unwrap().mode() & 0o7777,
        0o600
    );

    // Marking again writes nothing: the same inode stays in place.
    let inode = fs::symlink_metadata(&fx.record).unwrap().ino();
    assert_eq!(
        file.mark_stage_completed(&identity(), EPOCH).unwrap(),
        completed
    );
    assert_eq!(fs::symlink_metadata(&fx.record).unwrap().ino(), inode);

    assert!(file.remove(&identity()).unwrap());
    assert!(!fx.record.exists());
    assert!(!file.remove(&identity()).unwrap());
    assert_eq!(file.load(&identity()).unwrap(), None);
    // The staging path itself was never created or looked at.
    assert!(fs::symlink_metadata(&fx.staging).is_err());
}

#[test]
fn create_pending_resumes_an_existing_session_of_the_same_identity() {
    let fx = fixture();
    let file = fx.file();
    assert_eq!(
        file.create_pending(&record(EPOCH)).unwrap(),
        CreateOutcome::Created
    );
    let retry = record(MountEpoch::from_bytes([7; 16]));
    assert_eq!(
        file.create_pending(&retry).unwrap(),
        CreateOutcome::Existing(record(EPOCH))
    );
    let completed = file.mark_stage_completed(&identity(), EPOCH).unwrap();
    assert_eq!(
        file.create_pending(&retry).unwrap(),
        CreateOutcome::Existing(completed)
    );
}

#[test]
fn create_pending_refuses_a_record_of_another_identity() {
    let fx = fixture();
    let file = fx.file();
    let other = SessionRecord::pending(
        SessionIdentity::new("vol-1", 6, "node-a"),
        vec!["https://w1.example:7443".to_owned()],
        EPOCH,
    )
    .unwrap();
    assert_eq!(file.create_pending(&other).unwrap(), CreateOutcome::Created);
    let before = fs::read(&fx.record).unwrap();
    let e = file.create_pending(&record(EPOCH)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IdentityMismatch);
    assert_eq!(
        e.to_string(),
        format!(
            "session record {:?} names volume_generation 6, not 7",
            fx.record
        )
    );
    assert_eq!(fs::read(&fx.record).unwrap(), before);
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
    for (expected, problem) in cases {
        let fx = fixture();
        let file = fx.file();
        assert_eq!(
            file.create_pending(&record(EPOCH)).unwrap(),
            CreateOutcome::Created
        );
        for result in [
            file.load(&expected).map(drop),
            file.mark_stage_completed(&expected, EPOCH).map(drop),
            file.remove(&expected).map(drop),
        ] {
            let e = result.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::IdentityMismatch);
            assert!(e.to_string().contains(problem), "{e}");
        }
        assert_eq!(file.load(&identity()).unwrap(), Some(record(EPOCH)));
    }
}

#[test]
fn mark_stage_completed_refuses_another_claims_epoch_and_a_missing_record() {
    let fx = fixture();
    let file = fx.file();
    let e = file.mark_stage_completed(&identity(), EPOCH).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(e.to_string().ends_with("does not exist"), "{e}");

    assert_eq!(
        file.create_pending(&record(EPOCH)).unwrap(),
        CreateOutcome::Created
    );
    let other = MountEpoch::from_bytes([1; 16]);
    let e = file.mark_stage_completed(&identity(), other).unwrap_err();
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
    let fx = fixture();
    // The target is a valid record owned by us: following it would succeed.
    let target = fx.root.join("elsewhere");
    fs::write(&target, tak_os_session::render(&record(EPOCH))).unwrap();
    fs::set_permissions(&target, fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink(&target, &fx.record).unwrap();

    assert_refused_by_all(
        &fx,
        ErrorKind::Unsafe,
        "is a symlink; refusing to follow it",
    );
    assert!(fs::symlink_metadata(&fx.record).unwrap().is_symlink());
    assert_eq!(fs::read_link(&fx.record).unwrap(), target);
    assert_eq!(
        fs::read(&target).unwrap(),
        tak_os_session::render(&record(EPOCH))
    );
    assert_eq!(fs::metadata(&target).unwrap().mode() & 0o7777, 0o600);
}

#[test]
fn dangling_symlink_at_the_record_path_is_not_created_through() {
    let fx = fixture();
    let target = fx.root.join("missing");
    std::os::unix::fs::symlink(&target, &fx.record).unwrap();
    let e = fx.file().create_pending(&record(EPOCH)).unwrap_err();
    assert!(matches!(e, Error::Symlink { .. }), "{e}");
    assert!(!target.exists());
    assert!(fs::symlink_metadata(&fx.record).unwrap().is_symlink());
}

#[test]
fn record_of_another_owner_is_refused() {
    if !root_or_skip("record_of_another_owner_is_refused") {
        return;
    }
    let fx = fixture();
    fx.plant(&tak_os_session::render(&record(EPOCH)), 0o600);
    std::os::unix::fs::chown(&fx.record, Some(1), None).unwrap();
    assert_refused_by_all(
        &fx,
        ErrorKind::Unsafe,
        "is owned by uid 1, not by this process's uid 0",
    );
}

#[test]
fn record_with_a_wider_mode_is_refused() {
    for (mode, shown) in [
        (0o644, "mode 0644"),
        (0o640, "mode 0640"),
        (0o604, "mode 0604"),
        (0o700, "mode 0700"),
        (0o4600, "mode 4600"),
    ] {
        let fx = fixture();
        fx.plant(&tak_os_session::render(&record(EPOCH)), mode);
        assert_refused_by_all(&fx, ErrorKind::Unsafe, shown);
        assert!(
            chain(&fx.file().load(&identity()).unwrap_err()).contains("must be 0600 or narrower")
        );
    }
}

#[test]
fn record_with_a_narrower_mode_is_accepted() {
    let fx = fixture();
    fx.plant(&tak_os_session::render(&record(EPOCH)), 0o400);
    assert_eq!(fx.file().load(&identity()).unwrap(), Some(record(EPOCH)));
}

#[test]
fn record_with_another_hard_link_is_refused() {
    let fx = fixture();
    fx.plant(&tak_os_session::render(&record(EPOCH)), 0o600);
    fs::hard_link(&fx.record, fx.root.join("second-name")).unwrap();
    assert_refused_by_all(&fx, ErrorKind::Unsafe, "has 2 hard links; expected 1");
}

#[test]
fn record_that_is_not_a_regular_file_is_refused() {
    let fx = fixture();
    fs::create_dir(&fx.record).unwrap();
    assert_refused_by_all(&fx, ErrorKind::Unsafe, "is not a regular file");

    let fx = fixture();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fx.record,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    // A FIFO is never opened, so nothing waits for a writer.
    let e = fx.file().load(&identity()).unwrap_err();
    assert!(matches!(e, Error::NotRegularFile { .. }), "{e}");
}

#[test]
fn record_with_an_unknown_format_version_is_refused() {
    let fx = fixture();
    let text = String::from_utf8(tak_os_session::render(&record(EPOCH)))
        .unwrap()
        .replace(
            "\"format_version\": 1,",
            "\"format_version\": 2, \"new_field\": true,",
        );
    fx.plant(text.as_bytes(), 0o600);
    assert_refused_by_all(
        &fx,
        ErrorKind::Corrupt,
        "has unknown format version 2; this library reads version 1",
    );
}

#[test]
fn garbage_is_refused_as_malformed() {
    let fx = fixture();
    fx.plant(b"\x7fELF\x02\x01\x01 not a record", 0o600);
    assert_refused_by_all(&fx, ErrorKind::Corrupt, "malformed session record");
    assert!(chain(&fx.file().load(&identity()).unwrap_err()).contains("is not a JSON object"));

    let fx = fixture();
    fx.plant(b"{\"format_version\": 1, \"volume_id\": \"vol-", 0o600);
    assert_refused_by_all(&fx, ErrorKind::Corrupt, "is not valid JSON");
}

#[test]
fn unknown_field_is_refused_so_no_secret_can_hide_in_a_record() {
    let fx = fixture();
    let text = String::from_utf8(tak_os_session::render(&record(EPOCH)))
        .unwrap()
        .replace(
            "\"stage_completed\": false",
            "\"stage_completed\": false, \"bearer_token\": \"abc\"",
        );
    fx.plant(text.as_bytes(), 0o600);
    assert_refused_by_all(&fx, ErrorKind::Corrupt, "unknown field `bearer_token`");
    let text = chain(&fx.file().load(&identity()).unwrap_err());
    assert!(text.contains("does not match format version 1"), "{text}");
    assert!(!text.contains("abc"), "{text}");
}

#[test]
fn oversized_record_is_refused_before_reading() {
    let fx = fixture();
    let mut bytes = tak_os_session::render(&record(EPOCH));
    bytes.resize(tak_os_session::MAX_RECORD_BYTES as usize + 1, b' ');
    fx.plant(&bytes, 0o600);
    assert_refused_by_all(
        &fx,
        ErrorKind::Corrupt,
        "is 65537 bytes; the limit is 65536",
    );
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
    let fx = fixture();
    let file = fx.file();
    // A crash after the temp file was written, before the rename: the claim was never sent.
    fs::write(&fx.temp, tak_os_session::render(&record(EPOCH))).unwrap();
    assert_eq!(file.load(&identity()).unwrap(), None);
    assert!(!file.remove(&identity()).unwrap());
    assert!(!fx.temp.exists());

    // A torn temp file is replaced by the next write.
    fs::write(&fx.temp, b"{\"format_ver").unwrap();
    assert_eq!(file.load(&identity()).unwrap(), None);
    assert_eq!(
        file.create_pending(&record(EPOCH)).unwrap(),
        CreateOutcome::Created
    );
    assert!(!fx.temp.exists());
    assert_eq!(file.load(&identity()).unwrap(), Some(record(EPOCH)));

    // A leftover beside an existing record is ignored by load and cleaned by the next write.
    fs::write(&fx.temp, b"garbage").unwrap();
    assert_eq!(file.load(&identity()).unwrap(), Some(record(EPOCH)));
    file.mark_stage_completed(&identity(), EPOCH).unwrap();
    assert!(!fx.temp.exists());
    fs::write(&fx.temp, b"garbage").unwrap();
    assert!(file.remove(&identity()).unwrap());
    assert!(!fx.temp.exists());
}

#[test]
fn symlink_at_the_temp_path_is_removed_not_written_through() {
    let fx = fixture();
    let victim = fx.root.join("victim");
    fs::write(&victim, b"precious").unwrap();
    std::os::unix::fs::symlink(&victim, &fx.temp).unwrap();
    assert_eq!(
        fx.file().create_pending(&record(EPOCH)).unwrap(),
        CreateOutcome::Created
    );
    assert_eq!(fs::read(&victim).unwrap(), b"precious");
    assert!(fs::symlink_metadata(&fx.temp).is_err());
    assert!(fs::symlink_metadata(&fx.record).unwrap().is_file());
}

#[test]
fn format_version_1_golden_record_reads_back() {
    let golden =
        fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/record-v1.json")).unwrap();
    let fx = fixture();
    fx.plant(&golden, 0o600);
    let expected = SessionIdentity::new("pvc-6f1c2a9e-3b7d-4e2a-9c51-0d8e7f6a5b4c", 3, "node-a");
    let record = fx.file().load(&expected).unwrap().unwrap();
    assert_eq!(record.identity(), &expected);
    assert_eq!(
        record.endpoints(),
        [
            "https://worker-0.tak-os.svc:7443",
            "https://worker-1.tak-os.svc:7443",
            "https://[fd00::12]:7443",
        ]
    );
    assert_eq!(
        record.access_mode(),
        tak_os_session::AccessMode::ReadWriteOnce
    );
    assert_eq!(
        record.epoch().to_string(),
        "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
    );
    assert!(record.stage_completed());
    // Version 1 is the current format, and the golden file is in its canonical form.
    assert_eq!(tak_os_session::render(&record), golden);
}

#[test]
fn fuzz_seeds_hold_the_roundtrip_invariant() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/session_record_parse");
    let mut seen = 0;
    for entry in fs::read_dir(&dir).unwrap() {
        tak_os_session::roundtrip_check(&fs::read(entry.unwrap().path()).unwrap());
        seen += 1;
    }
    assert!(seen >= 5, "expected the seed corpus in {}", dir.display());
}
