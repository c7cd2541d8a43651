//! Volume records, consumer claims, capacity ranges and their on-disk JSON form.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Error, VolumeId};

/// The record format this library writes. It reads this version and refuses newer ones.
pub const FORMAT_VERSION: u32 = 1;

/// Largest record file this library reads; anything bigger is corrupt, not a reason to
/// allocate.
pub(crate) const MAX_RECORD_BYTES: u64 = 1 << 20;

/// Upper bound on the total bytes of a volume's parameters (keys plus values). CSI requires 4 KiB
/// to be accepted.
pub const MAX_PARAMETER_BYTES: usize = 16 * 1024;

/// Where a volume is in its lifecycle. Only `Ready` volumes exist outside an operation; the
/// other two are intent markers that reconciliation finishes or rolls back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VolumeState {
    /// The record is durable; the data directory may or may not exist yet.
    Creating,
    /// The record and the data directory both exist.
    Ready,
    /// Deletion has begun; the data directory may be partly removed.
    Deleting,
}

impl fmt::Display for VolumeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Creating => "creating",
            Self::Ready => "ready",
            Self::Deleting => "deleting",
        })
    }
}

/// One volume capability as the driver understands it. The store keeps it opaquely: it only
/// compares capabilities for CreateVolume idempotency and never interprets the strings.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Capability {
    /// The access mode, e.g. `SINGLE_NODE_WRITER`.
    pub access_mode: String,
    /// The access type, e.g. `mount` or `block`.
    pub access_type: String,
    /// The filesystem type for mount access, empty when unset.
    #[serde(default)]
    pub fs_type: String,
    /// Mount flags for mount access, in the caller's order.
    #[serde(default)]
    pub mount_flags: Vec<String>,
}

impl Capability {
    /// A mount capability with the given access mode and no filesystem type or flags.
    pub fn mount(access_mode: impl Into<String>) -> Self {
        Self {
            access_mode: access_mode.into(),
            access_type: "mount".to_owned(),
            fs_type: String::new(),
            mount_flags: Vec::new(),
        }
    }
}

/// A requested size range. Zero in either bound means that bound is unset, as in CSI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CapacityRange {
    /// The smallest acceptable size, or 0.
    pub required_bytes: u64,
    /// The largest acceptable size, or 0.
    pub limit_bytes: u64,
}

impl CapacityRange {
    /// A range with only a minimum.
    pub fn at_least(required_bytes: u64) -> Self {
        Self {
            required_bytes,
            limit_bytes: 0,
        }
    }

    /// Checks the range: a set limit below the required bytes is invalid.
    pub fn validate(&self) -> Result<(), Error> {
        if self.limit_bytes != 0 && self.limit_bytes < self.required_bytes {
            return Err(Error::InvalidCapacityRange {
                required_bytes: self.required_bytes,
                limit_bytes: self.limit_bytes,
            });
        }
        Ok(())
    }

    /// Whether a volume of `capacity_bytes` satisfies the range. A volume of unspecified size
    /// (0) satisfies only a range without a minimum.
    pub fn contains(&self, capacity_bytes: u64) -> bool {
        capacity_bytes >= self.required_bytes
            && (self.limit_bytes == 0 || capacity_bytes <= self.limit_bytes)
    }

    /// The capacity recorded for a new volume: the required bytes, or 0 (unspecified).
    pub fn recorded_capacity(range: Option<&Self>) -> u64 {
        range.map_or(0, |r| r.required_bytes)
    }
}

/// What a caller asks for when creating a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateRequest {
    /// The CSI volume name; the volume ID is derived from it.
    pub name: String,
    /// The size range; `None` means any size.
    pub capacity: Option<CapacityRange>,
    /// The capabilities; at least one is required. Compared as a set.
    pub capabilities: BTreeSet<Capability>,
    /// Opaque parameters from the storage class.
    pub parameters: BTreeMap<String, String>,
}

impl CreateRequest {
    /// A request for `name` with one capability and no size or parameters.
    pub fn new(name: impl Into<String>, capability: Capability) -> Self {
        Self {
            name: name.into(),
            capacity: None,
            capabilities: BTreeSet::from([capability]),
            parameters: BTreeMap::new(),
        }
    }

    /// Sets the capacity range.
    #[must_use]
    pub fn with_capacity(mut self, range: CapacityRange) -> Self {
        self.capacity = Some(range);
        self
    }

    /// Adds a parameter.
    #[must_use]
    pub fn with_parameter(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.parameters.insert(key.into(), value.into());
        self
    }

    pub(crate) fn validate(&self) -> Result<(), Error> {
        crate::id::validate_name(&self.name)?;
        if let Some(range) = &self.capacity {
            range.validate()?;
        }
        if self.capabilities.is_empty() {
            return Err(Error::InvalidArgument {
                field: "capabilities",
                value: String::new(),
                reason: "at least one capability is required",
            });
        }
        let mut total = 0usize;
        for (key, value) in &self.parameters {
            crate::id::validate_text("parameter key", key, MAX_PARAMETER_BYTES)?;
            if value.contains('\0') {
                return Err(Error::InvalidArgument {
                    field: "parameter value",
                    value: crate::id::truncated(value),
                    reason: "must not contain NUL",
                });
            }
            total = total.saturating_add(key.len()).saturating_add(value.len());
        }
        if total > MAX_PARAMETER_BYTES {
            return Err(Error::InvalidArgument {
                field: "parameters",
                value: format!("{total} bytes"),
                reason: "are too large",
            });
        }
        Ok(())
    }
}

/// The durable description of one volume, stored as `.metadata/<volume-id>.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeRecord {
    /// The record format; [`FORMAT_VERSION`] for records this library writes.
    pub format_version: u32,
    /// The volume ID, which also names the record and the data directory.
    pub volume_id: VolumeId,
    /// The original CSI name.
    pub name: String,
    /// The Kubernetes node name the store was opened with.
    pub node_name: String,
    /// The requested capacity in bytes; 0 means unspecified.
    pub capacity_bytes: u64,
    /// The capabilities the volume was created with.
    pub capabilities: BTreeSet<Capability>,
    /// The storage-class parameters the volume was created with.
    pub parameters: BTreeMap<String, String>,
    /// The lifecycle state.
    pub state: VolumeState,
}

/// A trusted consumer's ownership of a volume, stored as `.metadata/<volume-id>.consumer.json`
/// while the consumer owns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerClaim {
    /// The record format; [`FORMAT_VERSION`] for claims this library writes.
    pub format_version: u32,
    /// The claimed volume.
    pub volume_id: VolumeId,
    /// The consumer's publish target (absolute path).
    pub target: PathBuf,
}

#[derive(Deserialize)]
struct VersionProbe {
    format_version: Option<u64>,
}

/// Parses a record of type `T`, checking the format version first so that a record from a newer
/// format is reported as such rather than as a JSON mismatch.
///
/// Accepts only what [`render`] could write back: bytes or a rendering over
/// [`MAX_RECORD_BYTES`] are corrupt (a compact record renders larger than it parses).
pub(crate) fn parse<T: serde::de::DeserializeOwned + Serialize>(
    path: &Path,
    bytes: &[u8],
) -> Result<T, Error> {
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return Err(Error::corrupt(path, "is too large"));
    }
    let probe: VersionProbe = serde_json::from_slice(bytes).map_err(|e| Error::CorruptRecord {
        path: path.to_owned(),
        problem: "not a JSON object".to_owned(),
        source: Some(e),
    })?;
    match probe.format_version {
        None => return Err(Error::corrupt(path, "no format_version")),
        Some(v) if v > u64::from(FORMAT_VERSION) => {
            return Err(Error::UnsupportedFormat {
                path: path.to_owned(),
                found: v,
                supported: FORMAT_VERSION,
            });
        }
        Some(0) => return Err(Error::corrupt(path, "format_version 0")),
        Some(_) => {}
    }
    let record = serde_json::from_slice(bytes).map_err(|e| Error::CorruptRecord {
        path: path.to_owned(),
        problem: "fields do not match the record format".to_owned(),
        source: Some(e),
    })?;
    if render_unbounded(path, &record)?.len() as u64 > MAX_RECORD_BYTES {
        return Err(Error::corrupt(path, "renders over the record size limit"));
    }
    Ok(record)
}

/// Renders a record, refusing one over [`MAX_RECORD_BYTES`]: the store must never write a
/// record it would refuse to read back.
pub(crate) fn render<T: Serialize>(path: &Path, value: &T) -> Result<Vec<u8>, Error> {
    let bytes = render_unbounded(path, value)?;
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return Err(Error::InvalidArgument {
            field: "record",
            value: format!("{} bytes", bytes.len()),
            reason: "is over the 1 MiB record size limit",
        });
    }
    Ok(bytes)
}

/// Serializing these plain structs cannot fail; the error is still mapped rather than
/// unwrapped.
fn render_unbounded<T: Serialize>(path: &Path, value: &T) -> Result<Vec<u8>, Error> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(|e| Error::CorruptRecord {
        path: path.to_owned(),
        problem: "cannot render record".to_owned(),
        source: Some(e),
    })?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// The invariant the `localstore_record_parse` fuzz target asserts, exported so this crate's
/// tests exercise it too. Any input, read as a [`VolumeRecord`] and as a [`ConsumerClaim`],
/// either parses, renders within the 1 MiB record size limit, parses back to the same record
/// and renders to the same bytes again, or is refused as [`Corrupt`](crate::ErrorKind::Corrupt)
/// (which includes a newer format version), never with a panic.
///
/// # Panics
///
/// When the invariant does not hold.
pub fn record_roundtrip_check(input: &[u8]) {
    roundtrip_check::<VolumeRecord>(input);
    roundtrip_check::<ConsumerClaim>(input);
}

fn roundtrip_check<T>(input: &[u8])
where
    T: serde::de::DeserializeOwned + Serialize + PartialEq + fmt::Debug,
{
    let path = Path::new("record.json");
    let record: T = match parse(path, input) {
        Ok(record) => record,
        Err(e) => {
            assert_eq!(
                e.kind(),
                crate::ErrorKind::Corrupt,
                "parse refused input with a non-corrupt error: {e}"
            );
            return;
        }
    };
    let rendered = match render(path, &record) {
        Ok(rendered) => rendered,
        Err(e) => panic!("a record that parses does not render: {e}"),
    };
    let again: T = match parse(path, &rendered) {
        Ok(again) => again,
        Err(e) => panic!(
            "rendered record does not parse: {e}: {}",
            rendered.escape_ascii()
        ),
    };
    assert_eq!(again, record, "rendered record parses to different values");
    assert!(
        render(path, &again).is_ok_and(|bytes| bytes == rendered),
        "rendering is not stable"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NodeHash;

    fn record() -> VolumeRecord {
        let node = NodeHash::of("node-a").unwrap();
        VolumeRecord {
            format_version: FORMAT_VERSION,
            volume_id: VolumeId::new(node, "pvc-1").unwrap(),
            name: "pvc-1".to_owned(),
            node_name: "node-a".to_owned(),
            capacity_bytes: 1 << 30,
            capabilities: BTreeSet::from([Capability::mount("SINGLE_NODE_WRITER")]),
            parameters: BTreeMap::from([("k".to_owned(), "v".to_owned())]),
            state: VolumeState::Ready,
        }
    }

    #[test]
    fn records_round_trip() {
        let p = Path::new("r.json");
        let bytes = render(p, &record()).unwrap();
        assert_eq!(parse::<VolumeRecord>(p, &bytes).unwrap(), record());
    }

    #[test]
    fn version_1_record_on_disk_still_parses() {
        let bytes = include_bytes!("../tests/data/record-v1.json");
        let parsed: VolumeRecord = parse(Path::new("record-v1.json"), bytes).unwrap();
        assert_eq!(parsed, record());
    }

    #[test]
    fn newer_format_is_refused_not_downgraded() {
        let p = Path::new("r.json");
        let mut value = serde_json::to_value(record()).unwrap();
        value["format_version"] = 2.into();
        value["new_field"] = "x".into();
        let err = parse::<VolumeRecord>(p, value.to_string().as_bytes()).unwrap_err();
        assert!(
            matches!(err, Error::UnsupportedFormat { found: 2, .. }),
            "{err}"
        );
    }

    #[test]
    fn garbage_is_corrupt() {
        for bytes in [
            &b""[..],
            b"{",
            b"[]",
            b"{\"format_version\":1}",
            b"\xff\xfe",
            b"null",
        ] {
            let err = parse::<VolumeRecord>(Path::new("r"), bytes).unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::Corrupt, "{err}");
        }
    }

    #[test]
    fn the_roundtrip_invariant_holds_for_records_claims_and_garbage() {
        let claim = ConsumerClaim {
            format_version: FORMAT_VERSION,
            volume_id: record().volume_id,
            target: PathBuf::from("/consumer/1/r/mount"),
        };
        let p = Path::new("r.json");
        let mut inputs = vec![
            render(p, &record()).unwrap(),
            render(p, &claim).unwrap(),
            serde_json::to_vec(&record()).unwrap(),
            include_bytes!("../tests/data/record-v1.json").to_vec(),
            b"{\"format_version\":2}".to_vec(),
            b"\xff\xfe".to_vec(),
            b"[1,".repeat(200),
            Vec::new(),
        ];
        for state in [VolumeState::Creating, VolumeState::Deleting] {
            inputs.push(render(p, &VolumeRecord { state, ..record() }).unwrap());
        }
        for input in &inputs {
            record_roundtrip_check(input);
        }
    }

    #[test]
    fn a_record_is_refused_beyond_the_size_limit_on_both_sides() {
        let p = Path::new("r.json");
        // Compact, it fits; pretty-printed, as the store writes it, it would not.
        let mut big = record();
        big.parameters = (0..60_000)
            .map(|i| (format!("k{i:05}"), String::new()))
            .collect();
        let compact = serde_json::to_vec(&big).unwrap();
        assert!(compact.len() as u64 <= MAX_RECORD_BYTES);
        let err = parse::<VolumeRecord>(p, &compact).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Corrupt, "{err}");
        let err = render(p, &big).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument, "{err}");
        record_roundtrip_check(&compact);

        let mut padded = render(p, &record()).unwrap();
        padded.resize(usize::try_from(MAX_RECORD_BYTES).unwrap() + 1, b' ');
        let err = parse::<VolumeRecord>(p, &padded).unwrap_err();
        assert!(err.to_string().contains("too large"), "{err}");
    }

    proptest::proptest! {
        #[test]
        fn the_roundtrip_invariant_holds_near_valid_records(
            at in proptest::prelude::any::<proptest::sample::Index>(),
            byte in proptest::prelude::any::<u8>(),
        ) {
            let mut bytes = render(Path::new("r.json"), &record()).unwrap();
            let i = at.index(bytes.len());
            bytes[i] = byte;
            record_roundtrip_check(&bytes);
        }
    }

    #[test]
    fn capacity_range_rules() {
        assert!(
            CapacityRange {
                required_bytes: 10,
                limit_bytes: 5
            }
            .validate()
            .is_err()
        );
        assert!(
            CapacityRange {
                required_bytes: 10,
                limit_bytes: 10
            }
            .validate()
            .is_ok()
        );
        assert!(CapacityRange::default().contains(0));
        assert!(!CapacityRange::at_least(1).contains(0));
        assert!(
            CapacityRange {
                required_bytes: 0,
                limit_bytes: 5
            }
            .contains(5)
        );
        assert!(
            !CapacityRange {
                required_bytes: 0,
                limit_bytes: 5
            }
            .contains(6)
        );
    }
}
