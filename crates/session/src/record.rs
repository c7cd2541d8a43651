//! The session record, its identity, and its on-disk JSON form (pure: no I/O here).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::error::Category;

use crate::{Error, MountEpoch};

/// The record format this library writes and the only one it reads.
pub const FORMAT_VERSION: u32 = 1;

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

/// The access mode a session serves. Only RWO exists: one active node mount session per volume,
/// shared by the Pods on that node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AccessMode {
    /// ReadWriteOnce; `"rwo"` on disk.
    #[serde(rename = "rwo")]
    ReadWriteOnce,
}

/// One RWO node mount session (DESIGN.md 3.3): who it is for, which workers it talks to, the
/// mount epoch of its claim, and whether NodeStageVolume finished.
///
/// A record holds no TLS material and no tokens, and cannot: its fields are fixed, the parser
/// refuses unknown fields, and an endpoint may not carry user information, a query or a
/// fragment. Every `SessionRecord` is valid: [`SessionRecord::pending`] and [`parse`] check the
/// same bounds, so [`render`] never fails and its output always parses back.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionRecord {
    identity: SessionIdentity,
    endpoints: Vec<String>,
    access_mode: AccessMode,
    epoch: MountEpoch,
    stage_completed: bool,
}

impl SessionRecord {
    /// A new record whose stage has not completed, for a claim about to be sent with `epoch`.
    ///
    /// `endpoints` is the staged worker endpoint set, in the caller's order, e.g.
    /// `https://host:port`: 1 to [`MAX_ENDPOINTS`] distinct entries of printable ASCII, each at
    /// most [`MAX_ENDPOINT_BYTES`], without `@`, `?` or `#` (so no credential can ride along in
    /// a URL). Volume and node IDs are 1 to [`MAX_ID_BYTES`] bytes without control characters.
    pub fn pending(
        identity: SessionIdentity,
        endpoints: Vec<String>,
        epoch: MountEpoch,
    ) -> Result<Self, Error> {
        let record = Self {
            identity,
            endpoints,
            access_mode: AccessMode::ReadWriteOnce,
            epoch,
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
        self.access_mode
    }

    /// The mount epoch of the session's claim.
    pub fn epoch(&self) -> MountEpoch {
        self.epoch
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

/// Format version 1 as it is on disk. The in-memory [`SessionRecord`] is separate so that a
/// later format can be read into it too.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordV1 {
    format_version: u32,
    volume_id: String,
    volume_generation: u64,
    node_id: String,
    endpoints: Vec<String>,
    access_mode: AccessMode,
    epoch: MountEpoch,
    stage_completed: bool,
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
        source,
    }
}

/// Parses the bytes of a session record file.
///
/// Accepts exactly format version 1 (an unknown version is [`Error::UnsupportedFormat`], whatever
/// else the record holds), refuses unknown and duplicate fields, a mount epoch that is not 32
/// lowercase hex digits, and every value [`SessionRecord::pending`] refuses. Errors carry no
/// path; the file operations add it.
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
    if version != u64::from(FORMAT_VERSION) {
        return Err(Error::UnsupportedFormat {
            path: None,
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let wire: RecordV1 = serde_json::from_slice(bytes).map_err(|e| {
        malformed(
            format!("does not match format version {FORMAT_VERSION}"),
            Some(e),
        )
    })?;
    let record = SessionRecord {
        identity: SessionIdentity {
            volume_id: wire.volume_id,
            volume_generation: wire.volume_generation,
            node_id: wire.node_id,
        },
        endpoints: wire.endpoints,
        access_mode: wire.access_mode,
        epoch: wire.epoch,
        stage_completed: wire.stage_completed,
    };
    record
        .check()
        .map_err(|(field, reason)| malformed(format!("{field} {reason}"), None))?;
    Ok(record)
}

/// Renders a record in the current format: pretty-printed JSON with a trailing newline, fields
/// in a fixed order, so equal records render to equal bytes.
pub fn render(record: &SessionRecord) -> Vec<u8> {
    let wire = RecordV1 {
        format_version: FORMAT_VERSION,
        volume_id: record.identity.volume_id.clone(),
        volume_generation: record.identity.volume_generation,
        node_id: record.identity.node_id.clone(),
        endpoints: record.endpoints.clone(),
        access_mode: record.access_mode,
        epoch: record.epoch,
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

    pub(crate) fn sample() -> SessionRecord {
        SessionRecord::pending(
            SessionIdentity::new("vol-1", 7, "node-a"),
            vec![
                "https://w1.example:7443".to_owned(),
                "https://w2.example:7443".to_owned(),
            ],
            MountEpoch::from_bytes([0xab; 16]),
        )
        .unwrap()
    }

    fn problem(bytes: &[u8]) -> String {
        let e = parse(bytes).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Corrupt, "{e}");
        test_support::error_chain(&e)
    }

    fn edit(edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) -> Vec<u8> {
        let mut value: serde_json::Value = serde_json::from_slice(&render(&sample())).unwrap();
        edit(value.as_object_mut().unwrap());
        serde_json::to_vec(&value).unwrap()
    }

    #[test]
    fn renders_the_documented_form() {
        let text = String::from_utf8(render(&sample())).unwrap();
        assert_eq!(
            text,
            r#"{
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
"#
        );
        assert_eq!(parse(text.as_bytes()).unwrap(), sample());
    }

    #[test]
    fn unknown_format_versions_are_named() {
        for version in [0u64, 2, u64::MAX] {
            let bytes = edit(|m| {
                m.insert("format_version".into(), version.into());
                m.insert("tls_key".into(), "x".into());
            });
            let e = parse(&bytes).unwrap_err();
            assert!(
                matches!(e, Error::UnsupportedFormat { found, .. } if found == version),
                "{e}"
            );
            assert_eq!(
                e.to_string(),
                format!(
                    "session record has unknown format version {version}; this library reads version 1"
                )
            );
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
        assert!(
            problem(&edit(|m| {
                m.insert("token".into(), "secret".into());
            }))
            .contains("unknown field `token`")
        );
        assert!(
            problem(&edit(|m| {
                m.remove("epoch");
            }))
            .contains("missing field `epoch`")
        );
        let mut trailing = render(&sample());
        trailing.extend_from_slice(b"{}");
        assert!(problem(&trailing).contains("trailing characters"));
        let duplicate = String::from_utf8(render(&sample())).unwrap().replace(
            "\"node_id\": \"node-a\",",
            "\"node_id\": \"node-a\", \"node_id\": \"b\",",
        );
        assert!(problem(duplicate.as_bytes()).contains("duplicate field `node_id`"));
        assert!(
            problem(&edit(|m| {
                m.insert("epoch".into(), "ABABABABABABABABABABABABABABABAB".into());
            }))
            .contains("byte 0 is not a lowercase hex digit")
        );
        assert!(
            problem(&edit(|m| {
                m.insert("access_mode".into(), "rwx".into());
            }))
            .contains("unknown variant `rwx`")
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
            problem(&edit(|m| {
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
            problem(&edit(|m| {
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
            let endpoints = endpoints.into_iter().map(str::to_owned).collect();
            let e = SessionRecord::pending(identity, endpoints, epoch).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
            e.to_string()
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
    fn largest_valid_record_fits_the_read_limit() {
        // Quotes and backslashes are escaped to two bytes each: the worst case.
        let id = "\"".repeat(MAX_ID_BYTES);
        let endpoints = (0..MAX_ENDPOINTS)
            .map(|i| format!("{i:02}{}", "\\".repeat(MAX_ENDPOINT_BYTES - 2)))
            .collect();
        let record = SessionRecord::pending(
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

    pub(crate) fn records() -> impl Strategy<Value = SessionRecord> {
        let endpoint = "[!-~&&[^@?#]]{1,60}";
        (
            identities(),
            proptest::collection::btree_set(endpoint, 1..=MAX_ENDPOINTS),
            any::<[u8; 16]>(),
            any::<bool>(),
        )
            .prop_map(|(identity, endpoints, epoch, completed)| {
                let record = SessionRecord::pending(
                    identity,
                    endpoints.into_iter().collect(),
                    MountEpoch::from_bytes(epoch),
                )
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
