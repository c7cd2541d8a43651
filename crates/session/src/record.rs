//! The session record, its identity, and its on-disk JSON form (pure: no I/O here).

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::error::Category;

use crate::{Error, MountEpoch};

/// The newest record format this library reads and writes. It reads every version from 1 up
/// to this one, and refuses any other as [`Error::UnsupportedFormat`] whatever else the record
/// holds, so a record from a newer library is reported as a newer format, never as unknown
/// fields.
///
/// - **Version 1**: RWO records only: `"access_mode": "rwo"` with an `"epoch"`.
/// - **Version 2**: version 1 plus RWX records: `"access_mode": "rwx"` and no `"epoch"` field
///   (an RWX session has no lease). An RWO record marked version 2 reads exactly as version 1.
///
/// [`render`] writes each record with the oldest version that can express it: **RWO records as
/// version 1, RWX records as version 2.** An RWO record this library writes is therefore byte
/// for byte what the version-1 library wrote, and rolling the mount owner back to a version-1
/// library keeps every RWO stage readable, including those staged after the upgrade. Writing
/// everything as version 2 would be simpler, but it would make each of those RWO records
/// "unknown format version 2" to the older owner, breaking its restart and NodeUnstageVolume
/// for exactly the volumes that hold a lease, at the moment a rollback has to work. A
/// version-1 owner never opens `<staging>.rwx-session` (it does not know that name): after a
/// rollback it neither trusts nor removes RWX records, so one may outlive its stage.
pub const FORMAT_VERSION: u32 = 2;

/// The first format version, the only one before RWX records.
const FORMAT_VERSION_1: u32 = 1;

/// The version that introduced RWX records.
const RWX_FORMAT_VERSION: u32 = 2;

/// Largest record file this library reads. Every valid record renders well below it (see
/// [`MAX_ID_BYTES`], [`MAX_ENDPOINTS`], [`MAX_ENDPOINT_BYTES`]); anything bigger is corrupt, not
/// a reason to allocate.
pub const MAX_RECORD_BYTES: u64 = 64 * 1024;

/// Longest volume ID or node ID, in bytes.
pub const MAX_ID_BYTES: usize = 1024;

/// Most worker endpoints one record holds.
pub const MAX_ENDPOINTS: usize = 32;

/// Longest worker endpoint, in bytes.
pub const MAX_ENDPOINT_BYTES: usize = 512;

/// Which volume, at which generation, on which node a session record belongs to. [`load`] and
/// the other file operations compare the record's identity with the caller's and refuse a
/// record that names anything else.
///
/// [`load`]: crate::SessionFile::load
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionIdentity {
    /// The CSI volume ID.
    pub volume_id: String,
    /// The volume generation: a volume ID reused after deletion gets a new one.
    pub volume_generation: u64,
    /// The CSI node ID of this node.
    pub node_id: String,
}

impl SessionIdentity {
    /// An identity from its three parts.
    pub fn new(
        volume_id: impl Into<String>,
        volume_generation: u64,
        node_id: impl Into<String>,
    ) -> Self {
        Self {
            volume_id: volume_id.into(),
            volume_generation,
            node_id: node_id.into(),
        }
    }

    /// The first field that differs from `expected`, as (field, found, expected) with strings
    /// quoted, or `None` when the identities are equal.
    pub(crate) fn first_difference(
        &self,
        expected: &Self,
    ) -> Option<(&'static str, String, String)> {
        if self.volume_id != expected.volume_id {
            return Some((
                "volume_id",
                format!("{:?}", self.volume_id),
                format!("{:?}", expected.volume_id),
            ));
        }
        if self.volume_generation != expected.volume_generation {
            return Some((
                "volume_generation",
                self.volume_generation.to_string(),
                expected.volume_generation.to_string(),
            ));
        }
        if self.node_id != expected.node_id {
            return Some((
                "node_id",
                format!("{:?}", self.node_id),
                format!("{:?}", expected.node_id),
            ));
        }
        None
    }
}

/// The access mode a session serves. It decides the record's name beside the staging path and
/// whether the record holds a mount epoch. Deliberately not `#[non_exhaustive]`: a new mode
/// must force a decision wherever a caller matches on it.
///
/// Its [`Display`](fmt::Display) form is the on-disk spelling, `rwo` or `rwx`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AccessMode {
    /// ReadWriteOnce: one active node mount session per volume, shared by the Pods on that node
    /// and fenced by the mount epoch of its lease. `"rwo"` on disk, in
    /// `<staging>.rwo-session`; the record always holds an epoch.
    #[serde(rename = "rwo")]
    ReadWriteOnce,
    /// ReadWriteMany: no lease, so the record holds no epoch. `"rwx"` on disk, in
    /// `<staging>.rwx-session`; written as format version 2.
    #[serde(rename = "rwx")]
    ReadWriteMany,
}

impl AccessMode {
    /// Every access mode, in a fixed order.
    pub(crate) const ALL: [Self; 2] = [Self::ReadWriteOnce, Self::ReadWriteMany];
}

impl fmt::Display for AccessMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ReadWriteOnce => "rwo",
            Self::ReadWriteMany => "rwx",
        })
    }
}

/// The part of a record that differs between access modes: private, so that an RWX record
/// cannot hold an epoch and an RWO record cannot lack one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Lease {
    ReadWriteOnce(MountEpoch),
    ReadWriteMany,
}

/// One node mount session (DESIGN.md 3.3): who it is for, which workers it talks to, its
/// access mode, for RWO the mount epoch of its claim, and whether NodeStageVolume finished.
///
/// A record holds no TLS material and no tokens, and cannot: its fields are fixed, the parser
/// refuses unknown fields, and an endpoint may not carry user information, a query or a
/// fragment. Every `SessionRecord` is valid: [`SessionRecord::pending_rwo`],
/// [`SessionRecord::pending_rwx`] and [`parse`] check the same bounds, so [`render`] never
/// fails and its output always parses back.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionRecord {
    identity: SessionIdentity,
    endpoints: Vec<String>,
    lease: Lease,
    stage_completed: bool,
}

impl SessionRecord {
    /// A new RWO record whose stage has not completed, for a claim about to be sent with
    /// `epoch`.
    ///
    /// `endpoints` is the staged worker endpoint set, in the caller's order, e.g.
    /// `https://host:port`: 1 to [`MAX_ENDPOINTS`] distinct entries of printable ASCII, each at
    /// most [`MAX_ENDPOINT_BYTES`], without `@`, `?` or `#` (so no credential can ride along in
    /// a URL). Volume and node IDs are 1 to [`MAX_ID_BYTES`] bytes without control characters.
    pub fn pending_rwo(
        identity: SessionIdentity,
        endpoints: Vec<String>,
        epoch: MountEpoch,
    ) -> Result<Self, Error> {
        Self::pending(identity, endpoints, Lease::ReadWriteOnce(epoch))
    }

    /// A new RWX record whose stage has not completed. RWX has no lease, so there is no epoch;
    /// the bounds on `identity` and `endpoints` are those of
    /// [`pending_rwo`](Self::pending_rwo).
    pub fn pending_rwx(identity: SessionIdentity, endpoints: Vec<String>) -> Result<Self, Error> {
        Self::pending(identity, endpoints, Lease::ReadWriteMany)
    }

    fn pending(
        identity: SessionIdentity,
        endpoints: Vec<String>,
        lease: Lease,
    ) -> Result<Self, Error> {
        let record = Self {
            identity,
            endpoints,
            lease,
            stage_completed: false,
        };
        record
            .check()
            .map_err(|(field, reason)| Error::InvalidRecord { field, reason })?;
        Ok(record)
    }

    /// The volume, generation and node this record belongs to.
    pub fn identity(&self) -> &SessionIdentity {
        &self.identity
    }

    /// The staged worker endpoint set.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The access mode of the session.
    pub fn access_mode(&self) -> AccessMode {
        match self.lease {
            Lease::ReadWriteOnce(_) => AccessMode::ReadWriteOnce,
            Lease::ReadWriteMany => AccessMode::ReadWriteMany,
        }
    }

    /// The mount epoch of the session's claim: `Some` for every RWO record and `None` for every
    /// RWX record, never otherwise. This is the epoch a worker request carries (DESIGN.md 3.4:
    /// "the mount epoch, when the volume is RWO"), and the value
    /// [`SessionFile::mark_stage_completed`](crate::SessionFile::mark_stage_completed) takes.
    pub fn epoch(&self) -> Option<MountEpoch> {
        match self.lease {
            Lease::ReadWriteOnce(epoch) => Some(epoch),
            Lease::ReadWriteMany => None,
        }
    }

    /// Whether NodeStageVolume finished for this session.
    pub fn stage_completed(&self) -> bool {
        self.stage_completed
    }

    /// The same record with its stage completed.
    pub(crate) fn completed(mut self) -> Self {
        self.stage_completed = true;
        self
    }

    /// The format version [`render`] writes this record with: the oldest that can express it
    /// (see [`FORMAT_VERSION`]).
    fn format_version(&self) -> u32 {
        match self.lease {
            Lease::ReadWriteOnce(_) => FORMAT_VERSION_1,
            Lease::ReadWriteMany => RWX_FORMAT_VERSION,
        }
    }

    fn check(&self) -> Result<(), (&'static str, String)> {
        check_id("volume_id", &self.identity.volume_id)?;
        check_id("node_id", &self.identity.node_id)?;
        check_endpoints(&self.endpoints).map_err(|reason| ("endpoints", reason))
    }
}

fn check_id(field: &'static str, value: &str) -> Result<(), (&'static str, String)> {
    if value.is_empty() {
        return Err((field, "is empty".to_owned()));
    }
    if value.len() > MAX_ID_BYTES {
        return Err((
            field,
            format!("is {} bytes; the limit is {MAX_ID_BYTES}", value.len()),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err((field, "contains a control character".to_owned()));
    }
    Ok(())
}

/// Checks the endpoint set. Reasons name an entry by index and never quote it: a refused entry
/// may be exactly the credential that must not be shown.
fn check_endpoints(endpoints: &[String]) -> Result<(), String> {
    if endpoints.is_empty() {
        return Err("is empty; a session needs at least one worker endpoint".to_owned());
    }
    if endpoints.len() > MAX_ENDPOINTS {
        return Err(format!(
            "has {} entries; the limit is {MAX_ENDPOINTS}",
            endpoints.len()
        ));
    }
    let mut seen = BTreeSet::new();
    for (i, endpoint) in endpoints.iter().enumerate() {
        let bytes = endpoint.as_bytes();
        if bytes.is_empty() {
            return Err(format!("entry {i} is empty"));
        }
        if bytes.len() > MAX_ENDPOINT_BYTES {
            return Err(format!(
                "entry {i} is {} bytes; the limit is {MAX_ENDPOINT_BYTES}",
                bytes.len()
            ));
        }
        if !bytes.iter().all(u8::is_ascii_graphic) {
            return Err(format!(
                "entry {i} has a character other than printable ASCII"
            ));
        }
        if bytes.contains(&b'@') {
            return Err(format!(
                "entry {i} has user information; credentials never go in a session record"
            ));
        }
        if bytes.contains(&b'?') || bytes.contains(&b'#') {
            return Err(format!(
                "entry {i} has a query or fragment; tokens never go in a session record"
            ));
        }
        if !seen.insert(endpoint.as_str()) {
            return Err(format!("entry {i} repeats an earlier entry"));
        }
    }
    Ok(())
}

/// Format versions 1 and 2 as they are on disk: version 2 only adds the `rwx` access mode,
/// whose records omit `epoch`. Which combinations of version, access mode and epoch are valid
/// is checked after deserializing. The in-memory [`SessionRecord`] is separate so that a later
/// format can be read into it too.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordWire {
    format_version: u32,
    volume_id: String,
    volume_generation: u64,
    node_id: String,
    endpoints: Vec<String>,
    access_mode: AccessMode,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present_epoch"
    )]
    epoch: Option<MountEpoch>,
    stage_completed: bool,
}

/// An `epoch` field that is there is an epoch: `null` is refused, not read as "no epoch", so
/// every record has one spelling.
fn present_epoch<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<MountEpoch>, D::Error> {
    MountEpoch::deserialize(deserializer).map(Some)
}

/// Only the version, read before the rest so that a newer record is reported as a newer
/// format rather than as unknown fields.
#[derive(Deserialize)]
struct VersionProbe {
    format_version: Option<serde_json::Value>,
}

fn malformed(problem: impl Into<String>, source: Option<serde_json::Error>) -> Error {
    Error::Malformed {
        path: None,
        problem: problem.into(),
        source: source.map(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>),
    }
}

/// Parses the bytes of a session record file of either access mode.
///
/// Accepts format versions 1 to [`FORMAT_VERSION`] (any other version is
/// [`Error::UnsupportedFormat`], whatever else the record holds) and refuses unknown and
/// duplicate fields, a mount epoch that is not 32 lowercase hex digits, an RWO record without
/// an epoch, an RWX record with one (or marked version 1), and every value
/// [`SessionRecord::pending_rwo`] refuses. Errors carry no path; the file operations add it.
pub fn parse(bytes: &[u8]) -> Result<SessionRecord, Error> {
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return Err(malformed(
            format!("is larger than {MAX_RECORD_BYTES} bytes"),
            None,
        ));
    }
    // serde also reads a struct from a JSON array; a record is only ever an object.
    if bytes.trim_ascii_start().first() != Some(&b'{') {
        return Err(malformed("is not a JSON object", None));
    }
    let probe: VersionProbe = serde_json::from_slice(bytes).map_err(|e| {
        let problem = match e.classify() {
            Category::Syntax | Category::Eof | Category::Io => "is not valid JSON",
            Category::Data => "has an unreadable format_version",
        };
        malformed(problem, Some(e))
    })?;
    let version = match probe.format_version {
        None => return Err(malformed("has no format_version", None)),
        Some(value) => value.as_u64().ok_or_else(|| {
            malformed(
                "has a format_version that is not a non-negative integer",
                None,
            )
        })?,
    };
    if !(u64::from(FORMAT_VERSION_1)..=u64::from(FORMAT_VERSION)).contains(&version) {
        return Err(Error::UnsupportedFormat {
            path: None,
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let wire: RecordWire = serde_json::from_slice(bytes)
        .map_err(|e| malformed(format!("does not match format version {version}"), Some(e)))?;
    let lease = match (wire.access_mode, wire.epoch) {
        (AccessMode::ReadWriteOnce, Some(epoch)) => Lease::ReadWriteOnce(epoch),
        (AccessMode::ReadWriteOnce, None) => {
            return Err(malformed("has access mode rwo but no epoch", None));
        }
        (AccessMode::ReadWriteMany, _) if wire.format_version < RWX_FORMAT_VERSION => {
            return Err(malformed(
                format!(
                    "has access mode rwx, which format version {} does not have",
                    wire.format_version
                ),
                None,
            ));
        }
        (AccessMode::ReadWriteMany, Some(_)) => {
            return Err(malformed(
                "has access mode rwx and an epoch; an rwx session has no lease",
                None,
            ));
        }
        (AccessMode::ReadWriteMany, None) => Lease::ReadWriteMany,
    };
    let record = SessionRecord {
        identity: SessionIdentity {
            volume_id: wire.volume_id,
            volume_generation: wire.volume_generation,
            node_id: wire.node_id,
        },
        endpoints: wire.endpoints,
        lease,
        stage_completed: wire.stage_completed,
    };
    record
        .check()
        .map_err(|(field, reason)| malformed(format!("{field} {reason}"), None))?;
    Ok(record)
}

/// Renders a record: pretty-printed JSON with a trailing newline, fields in a fixed order, so
/// equal records render to equal bytes. An RWO record is written as format version 1 and an
/// RWX record as version 2, without an `epoch` field; [`FORMAT_VERSION`] says why.
pub fn render(record: &SessionRecord) -> Vec<u8> {
    let wire = RecordWire {
        format_version: record.format_version(),
        volume_id: record.identity.volume_id.clone(),
        volume_generation: record.identity.volume_generation,
        node_id: record.identity.node_id.clone(),
        endpoints: record.endpoints.clone(),
        access_mode: record.access_mode(),
        epoch: record.epoch(),
        stage_completed: record.stage_completed,
    };
    match serde_json::to_vec_pretty(&wire) {
        Ok(mut bytes) => {
            bytes.push(b'\n');
            bytes
        }
        // serde_json fails only on a map with non-string keys or a failing `Serialize` impl;
        // this struct has neither.
        Err(e) => unreachable!("a session record always serializes: {e}"),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    fn endpoints() -> Vec<String> {
        vec![
            "https://w1.example:7443".to_owned(),
            "https://w2.example:7443".to_owned(),
        ]
    }

    pub(crate) fn sample() -> SessionRecord {
        SessionRecord::pending_rwo(
            SessionIdentity::new("vol-1", 7, "node-a"),
            endpoints(),
            MountEpoch::from_bytes([0xab; 16]),
        )
        .unwrap()
    }

    fn sample_rwx() -> SessionRecord {
        SessionRecord::pending_rwx(SessionIdentity::new("vol-1", 7, "node-a"), endpoints()).unwrap()
    }

    const RWO_V1: &str = r#"{
  "format_version": 1,
  "volume_id": "vol-1",
  "volume_generation": 7,
  "node_id": "node-a",
  "endpoints": [
    "https://w1.example:7443",
    "https://w2.example:7443"
  ],
  "access_mode": "rwo",
  "epoch": "abababababababababababababababab",
  "stage_completed": false
}
"#;

    const RWX_V2: &str = r#"{
  "format_version": 2,
  "volume_id": "vol-1",
  "volume_generation": 7,
  "node_id": "node-a",
  "endpoints": [
    "https://w1.example:7443",
    "https://w2.example:7443"
  ],
  "access_mode": "rwx",
  "stage_completed": false
}
"#;

    fn problem(bytes: &[u8]) -> String {
        let e = parse(bytes).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Corrupt, "{e}");
        test_support::error_chain(&e)
    }

    fn edit_of(
        record: &SessionRecord,
        edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
    ) -> Vec<u8> {
        let mut value: serde_json::Value = serde_json::from_slice(&render(record)).unwrap();
        edit(value.as_object_mut().unwrap());
        serde_json::to_vec(&value).unwrap()
    }

    fn edit(edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) -> Vec<u8> {
        edit_of(&sample(), edit)
    }

    #[test]
    fn renders_the_documented_form() {
        let text = String::from_utf8(render(&sample())).unwrap();
        assert_eq!(text, RWO_V1);
        assert_eq!(parse(text.as_bytes()).unwrap(), sample());
    }

    #[test]
    fn version_1_record_reads_as_rwo() {
        let record = parse(RWO_V1.as_bytes()).unwrap();
        assert_eq!(record.access_mode(), AccessMode::ReadWriteOnce);
        assert_eq!(record.epoch(), Some(MountEpoch::from_bytes([0xab; 16])));
        assert_eq!(
            record.identity(),
            &SessionIdentity::new("vol-1", 7, "node-a")
        );
        assert_eq!(record.endpoints(), endpoints());
        assert!(!record.stage_completed());
    }

    #[test]
    fn rwx_record_renders_as_version_2_without_an_epoch_and_round_trips() {
        let record = sample_rwx();
        assert_eq!(record.access_mode(), AccessMode::ReadWriteMany);
        assert_eq!(record.epoch(), None);
        let text = String::from_utf8(render(&record)).unwrap();
        assert_eq!(text, RWX_V2);
        assert_eq!(parse(text.as_bytes()).unwrap(), record);
        let completed = record.completed();
        assert_eq!(parse(&render(&completed)).unwrap(), completed);
        crate::roundtrip_check(text.as_bytes());
    }

    #[test]
    fn version_2_rwo_record_reads_like_version_1_and_renders_as_version_1() {
        let v2 = RWO_V1.replace("\"format_version\": 1,", "\"format_version\": 2,");
        assert_eq!(parse(v2.as_bytes()).unwrap(), sample());
        assert_eq!(render(&parse(v2.as_bytes()).unwrap()), RWO_V1.as_bytes());
        crate::roundtrip_check(v2.as_bytes());
    }

    #[test]
    fn rwx_record_with_an_epoch_is_refused() {
        let with_epoch = edit_of(&sample_rwx(), |m| {
            m.insert("epoch".into(), "abababababababababababababababab".into());
        });
        assert!(
            problem(&with_epoch)
                .contains("has access mode rwx and an epoch; an rwx session has no lease")
        );
        // `null` is not "no epoch": every record has one spelling.
        let null_epoch = edit_of(&sample_rwx(), |m| {
            m.insert("epoch".into(), serde_json::Value::Null);
        });
        assert!(problem(&null_epoch).contains("invalid type: null"));
    }

    #[test]
    fn rwo_record_without_an_epoch_is_refused() {
        for version in [1u32, 2] {
            let bytes = edit(|m| {
                m.insert("format_version".into(), version.into());
                m.remove("epoch");
            });
            assert!(problem(&bytes).contains("has access mode rwo but no epoch"));
        }
        let null_epoch = edit(|m| {
            m.insert("epoch".into(), serde_json::Value::Null);
        });
        assert!(problem(&null_epoch).contains("invalid type: null"));
    }

    #[test]
    fn rwx_record_marked_version_1_is_refused() {
        for with_epoch in [false, true] {
            let bytes = edit_of(&sample_rwx(), |m| {
                m.insert("format_version".into(), 1.into());
                if with_epoch {
                    m.insert("epoch".into(), "abababababababababababababababab".into());
                }
            });
            assert!(
                problem(&bytes)
                    .contains("has access mode rwx, which format version 1 does not have")
            );
        }
    }

    #[test]
    fn unknown_format_versions_are_named() {
        for version in [0u64, 3, u64::MAX] {
            for record in [sample(), sample_rwx()] {
                let bytes = edit_of(&record, |m| {
                    m.insert("format_version".into(), version.into());
                    m.insert("tls_key".into(), "x".into());
                });
                let e = parse(&bytes).unwrap_err();
                assert!(
                    matches!(e, Error::UnsupportedFormat { found, supported: 2, .. } if found == version),
                    "{e}"
                );
                assert_eq!(
                    e.to_string(),
                    format!(
                        "session record has unknown format version {version}; this library reads versions 1 to 2"
                    )
                );
            }
        }
    }

    #[test]
    fn refusals_name_the_problem() {
        assert!(problem(b"").contains("is not a JSON object"));
        assert!(problem(b"{\"format_version\": 1,").contains("is not valid JSON"));
        assert!(problem(b"{garbage").contains("is not valid JSON"));
        assert!(problem(b"\x00garbage").contains("is not a JSON object"));
        assert!(problem(b"[1]").contains("is not a JSON object"));
        assert!(problem(b"1").contains("is not a JSON object"));
        let array =
            r#"[1, "v", 1, "n", ["https://w"], "rwo", "abababababababababababababababab", false]"#;
        assert!(problem(array.as_bytes()).contains("is not a JSON object"));
        assert!(problem(b"{}").contains("has no format_version"));
        assert!(problem(b"{\"format_version\": \"1\"}").contains("not a non-negative integer"));
        assert!(problem(b"{\"format_version\": -1}").contains("not a non-negative integer"));
        assert!(problem(b"{\"format_version\": 1.0}").contains("not a non-negative integer"));
        assert!(problem(b"{\"format_version\": 2.0}").contains("not a non-negative integer"));
        assert!(
            problem(&edit(|m| {
                m.insert("token".into(), "secret".into());
            }))
            .contains("unknown field `token`")
        );
        assert!(
            problem(&edit_of(&sample_rwx(), |m| {
                m.insert("token".into(), "secret".into());
            }))
            .contains("does not match format version 2")
        );
        let mut trailing = render(&sample());
        trailing.extend_from_slice(b"{}");
        assert!(problem(&trailing).contains("trailing characters"));
        let duplicate = String::from_utf8(render(&sample())).unwrap().replace(
            "\"node_id\": \"node-a\",",
            "\"node_id\": \"node-a\", \"node_id\": \"b\",",
        );
        assert!(problem(duplicate.as_bytes()).contains("duplicate field `node_id`"));
        let duplicate_epoch = String::from_utf8(render(&sample())).unwrap().replace(
            "\"stage_completed\"",
            "\"epoch\": \"abababababababababababababababab\", \"stage_completed\"",
        );
        assert!(problem(duplicate_epoch.as_bytes()).contains("duplicate field `epoch`"));
        assert!(
            problem(&edit(|m| {
                m.insert("epoch".into(), "ABABABABABABABABABABABABABABABAB".into());
            }))
            .contains("byte 0 is not a lowercase hex digit")
        );
        assert!(
            problem(&edit(|m| {
                m.insert("access_mode".into(), "rox".into());
            }))
            .contains("unknown variant `rox`")
        );
        assert!(
            problem(&edit(|m| {
                m.insert("endpoints".into(), serde_json::json!([]));
            }))
            .contains("endpoints is empty")
        );
        let with_credential = problem(&edit(|m| {
            m.insert(
                "endpoints".into(),
                serde_json::json!(["https://user:hunter2@w1:7443"]),
            );
        }));
        assert!(with_credential.contains("entry 0 has user information"));
        assert!(!with_credential.contains("hunter2"));
        assert!(
            problem(&edit_of(&sample_rwx(), |m| {
                m.insert(
                    "endpoints".into(),
                    serde_json::json!(["https://w1/?token=t"]),
                );
            }))
            .contains("entry 0 has a query or fragment")
        );
        assert!(
            problem(&edit(|m| {
                m.insert(
                    "endpoints".into(),
                    serde_json::json!(["https://a", "https://a"]),
                );
            }))
            .contains("entry 1 repeats an earlier entry")
        );
        assert!(
            problem(&edit(|m| {
                m.insert("volume_id".into(), "".into());
            }))
            .contains("volume_id is empty")
        );
        assert!(
            problem(&edit_of(&sample_rwx(), |m| {
                m.insert("node_id".into(), "a\nb".into());
            }))
            .contains("node_id contains a control character")
        );
        assert!(
            problem(&edit(|m| {
                m.insert("volume_generation".into(), (-1).into());
            }))
            .contains("does not match format version 1")
        );
        let oversized = vec![b' '; MAX_RECORD_BYTES as usize + 1];
        assert!(problem(&oversized).contains("is larger than 65536 bytes"));
    }

    #[test]
    fn pending_refuses_what_parse_refuses() {
        let identity = SessionIdentity::new("vol-1", 1, "node-a");
        let epoch = MountEpoch::from_bytes([1; 16]);
        let refusal = |identity: SessionIdentity, endpoints: Vec<&str>| {
            let endpoints: Vec<String> = endpoints.into_iter().map(str::to_owned).collect();
            let rwo =
                SessionRecord::pending_rwo(identity.clone(), endpoints.clone(), epoch).unwrap_err();
            let rwx = SessionRecord::pending_rwx(identity, endpoints).unwrap_err();
            assert_eq!(rwo.kind(), crate::ErrorKind::InvalidArgument);
            assert_eq!(rwx.kind(), crate::ErrorKind::InvalidArgument);
            assert_eq!(rwo.to_string(), rwx.to_string());
            rwo.to_string()
        };
        assert_eq!(
            refusal(identity.clone(), vec![]),
            "invalid session record: endpoints is empty; a session needs at least one worker endpoint"
        );
        assert_eq!(
            refusal(identity.clone(), vec!["https://a b"]),
            "invalid session record: endpoints entry 0 has a character other than printable ASCII"
        );
        assert_eq!(
            refusal(
                SessionIdentity::new("v".repeat(MAX_ID_BYTES + 1), 1, "n"),
                vec!["https://a"]
            ),
            "invalid session record: volume_id is 1025 bytes; the limit is 1024"
        );
        assert_eq!(
            refusal(SessionIdentity::new("v", 1, ""), vec!["https://a"]),
            "invalid session record: node_id is empty"
        );
        let many: Vec<String> = (0..=MAX_ENDPOINTS)
            .map(|i| format!("https://w{i}"))
            .collect();
        assert_eq!(
            refusal(identity, many.iter().map(String::as_str).collect()),
            "invalid session record: endpoints has 33 entries; the limit is 32"
        );
    }

    #[test]
    fn access_mode_displays_its_on_disk_spelling() {
        for mode in AccessMode::ALL {
            assert_eq!(serde_json::to_string(&mode).unwrap(), format!("\"{mode}\""));
        }
    }

    #[test]
    fn largest_valid_record_fits_the_read_limit() {
        // Quotes and backslashes are escaped to two bytes each: the worst case. An RWO record
        // is the larger kind: it has an epoch.
        let id = "\"".repeat(MAX_ID_BYTES);
        let endpoints = (0..MAX_ENDPOINTS)
            .map(|i| format!("{i:02}{}", "\\".repeat(MAX_ENDPOINT_BYTES - 2)))
            .collect();
        let record = SessionRecord::pending_rwo(
            SessionIdentity::new(id.clone(), u64::MAX, id),
            endpoints,
            MountEpoch::from_bytes([0xff; 16]),
        )
        .unwrap()
        .completed();
        let bytes = render(&record);
        assert!(bytes.len() as u64 <= MAX_RECORD_BYTES, "{}", bytes.len());
        assert_eq!(parse(&bytes).unwrap(), record);
    }

    pub(crate) fn identities() -> impl Strategy<Value = SessionIdentity> {
        let id = "[^\\p{Cc}]{1,40}";
        (id, any::<u64>(), id).prop_map(|(v, g, n)| SessionIdentity::new(v, g, n))
    }

    /// Records of both access modes: `None` for the epoch draws an RWX record.
    pub(crate) fn records() -> impl Strategy<Value = SessionRecord> {
        let endpoint = "[!-~&&[^@?#]]{1,60}";
        (
            identities(),
            proptest::collection::btree_set(endpoint, 1..=MAX_ENDPOINTS),
            proptest::option::of(any::<[u8; 16]>()),
            any::<bool>(),
        )
            .prop_map(|(identity, endpoints, epoch, completed)| {
                let endpoints = endpoints.into_iter().collect();
                let record = match epoch {
                    Some(epoch) => SessionRecord::pending_rwo(
                        identity,
                        endpoints,
                        MountEpoch::from_bytes(epoch),
                    ),
                    None => SessionRecord::pending_rwx(identity, endpoints),
                }
                .unwrap();
                if completed {
                    record.completed()
                } else {
                    record
                }
            })
    }

    proptest! {
        #[test]
        fn render_then_parse_is_identity(record in records()) {
            let bytes = render(&record);
            prop_assert!(bytes.len() as u64 <= MAX_RECORD_BYTES);
            prop_assert_eq!(parse(&bytes).unwrap(), record);
            crate::roundtrip_check(&bytes);
        }

        #[test]
        fn every_record_reads_the_same_marked_version_2(record in records()) {
            let v2 = edit_of(&record, |m| {
                m.insert("format_version".into(), 2.into());
            });
            prop_assert_eq!(parse(&v2).unwrap(), record);
            crate::roundtrip_check(&v2);
        }

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            crate::roundtrip_check(&bytes);
        }

        #[test]
        fn parse_never_panics_on_near_records(
            record in records(),
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            let mut bytes = render(&record);
            let i = at.index(bytes.len());
            bytes[i] = byte;
            crate::roundtrip_check(&bytes);
        }
    }
}
