//! Where a staging path's session record lives.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::{AccessMode, Error};

/// What a staging path's file name gets to become the name of its RWO session record.
pub const RWO_RECORD_SUFFIX: &str = ".rwo-session";

/// What a staging path's file name gets to become the name of its RWX session record.
pub const RWX_RECORD_SUFFIX: &str = ".rwx-session";

/// Linux `PATH_MAX`, counting the terminating NUL.
const MAX_PATH_BYTES: usize = 4096;
/// Linux `NAME_MAX`.
const MAX_NAME_BYTES: usize = 255;

/// The session record paths of a staging path, in the staging path's parent directory:
/// `<staging>.rwo-session` for an RWO session and `<staging>.rwx-session` for an RWX one (at
/// most one of them exists), and the temp names their durable writes go through.
///
/// Building one touches no file system; in particular the staging path itself, which may be a
/// dead FUSE mount, is never looked at by this crate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionPath {
    staging: PathBuf,
    directory: PathBuf,
    rwo_name: OsString,
    rwx_name: OsString,
}

impl SessionPath {
    /// The session path for `staging`, which must be absolute and clean: no `.`, `..` or empty
    /// components, no trailing slash, no NUL, not `/`, and short enough that both records and
    /// their temp files fit `PATH_MAX` and `NAME_MAX`.
    pub fn new(staging: &Path) -> Result<Self, Error> {
        let bytes = staging.as_os_str().as_bytes();
        let invalid = |reason| {
            Err(Error::InvalidStagingPath {
                path: staging.to_owned(),
                reason,
            })
        };
        if !staging.is_absolute() {
            return invalid("it is not absolute");
        }
        if bytes.contains(&0) {
            return invalid("it contains a NUL byte");
        }
        if bytes == b"/" {
            return invalid("it is the root directory");
        }
        if bytes.ends_with(b"/") {
            return invalid("it ends with a slash");
        }
        if bytes.windows(2).any(|w| w == b"//") {
            return invalid("it contains an empty component");
        }
        // `Path::components` hides `.` in the middle of a path, so check the raw components.
        if bytes.split(|&b| b == b'/').any(|c| c == b"." || c == b"..") {
            return invalid("it contains a `.` or `..` component");
        }
        let (Some(directory), Some(name)) = (staging.parent(), staging.file_name()) else {
            return invalid("it has no parent directory");
        };
        let record_name = |suffix| {
            let mut record_name = name.to_owned();
            record_name.push(suffix);
            record_name
        };
        let (rwo_name, rwx_name) = (
            record_name(RWO_RECORD_SUFFIX),
            record_name(RWX_RECORD_SUFFIX),
        );
        for record_name in [&rwo_name, &rwx_name] {
            // Fixed, not random: a leftover is recognised and replaced by the next write; the
            // caller's per-volume serialisation keeps two writers of one record apart.
            let temp_name = durable::temp_name(record_name);
            if temp_name.len() > MAX_NAME_BYTES {
                return invalid("its last component is too long to carry a session record");
            }
            if bytes.len() + 1 + temp_name.len() >= MAX_PATH_BYTES {
                return invalid("it is too long to carry a session record");
            }
        }
        Ok(Self {
            staging: staging.to_owned(),
            directory: directory.to_owned(),
            rwo_name,
            rwx_name,
        })
    }

    /// The staging path this session belongs to.
    pub fn staging(&self) -> &Path {
        &self.staging
    }

    /// The directory that holds the record: the staging path's parent.
    pub fn directory(&self) -> &Path {
        &self.directory
    }

    /// The full path of the record of a session of `mode`: `<staging>.rwo-session` or
    /// `<staging>.rwx-session`.
    pub fn record(&self, mode: AccessMode) -> PathBuf {
        self.directory.join(self.record_name(mode))
    }

    /// The full path of the temp file of `mode`'s record, `.<staging name>.rwo-session.tmp` or
    /// `.<staging name>.rwx-session.tmp` beside it. A file there is a leftover of an
    /// interrupted write: never read, removed by the next write of that record or by
    /// [`SessionFile::remove`](crate::SessionFile::remove).
    pub fn temp(&self, mode: AccessMode) -> PathBuf {
        self.directory
            .join(durable::temp_name(self.record_name(mode)))
    }

    /// The name of `mode`'s record inside [`directory`](Self::directory).
    pub(crate) fn record_name(&self, mode: AccessMode) -> &OsStr {
        match mode {
            AccessMode::ReadWriteOnce => &self.rwo_name,
            AccessMode::ReadWriteMany => &self.rwx_name,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(path: &str) -> String {
        SessionPath::new(Path::new(path)).unwrap_err().to_string()
    }

    #[test]
    fn record_sits_beside_the_staging_path() {
        let path = SessionPath::new(Path::new("/var/lib/kubelet/csi/abc/globalmount")).unwrap();
        assert_eq!(path.directory(), Path::new("/var/lib/kubelet/csi/abc"));
        assert_eq!(
            path.record(AccessMode::ReadWriteOnce),
            Path::new("/var/lib/kubelet/csi/abc/globalmount.rwo-session")
        );
        assert_eq!(
            path.temp(AccessMode::ReadWriteOnce),
            Path::new("/var/lib/kubelet/csi/abc/.globalmount.rwo-session.tmp")
        );
        assert_eq!(
            path.record(AccessMode::ReadWriteMany),
            Path::new("/var/lib/kubelet/csi/abc/globalmount.rwx-session")
        );
        assert_eq!(
            path.temp(AccessMode::ReadWriteMany),
            Path::new("/var/lib/kubelet/csi/abc/.globalmount.rwx-session.tmp")
        );
        let top = SessionPath::new(Path::new("/stage")).unwrap();
        assert_eq!(
            top.record(AccessMode::ReadWriteOnce),
            Path::new("/stage.rwo-session")
        );
        assert_eq!(
            top.record(AccessMode::ReadWriteMany),
            Path::new("/stage.rwx-session")
        );
    }

    #[test]
    fn unclean_staging_paths_are_refused_with_the_reason() {
        assert_eq!(
            refusal("var/stage"),
            "invalid staging path \"var/stage\": it is not absolute"
        );
        assert!(refusal("/").ends_with("it is the root directory"));
        assert!(refusal("/a/stage/").ends_with("it ends with a slash"));
        assert!(refusal("/a//stage").ends_with("it contains an empty component"));
        assert!(refusal("/a/./stage").ends_with("it contains a `.` or `..` component"));
        assert!(refusal("/a/../stage").ends_with("it contains a `.` or `..` component"));
        assert!(refusal("/a/..").ends_with("it contains a `.` or `..` component"));
        assert!(refusal("/a/st\0age").ends_with("it contains a NUL byte"));
        let long_name = format!("/a/{}", "n".repeat(MAX_NAME_BYTES - 16));
        assert!(refusal(&long_name).ends_with("too long to carry a session record"));
        assert!(
            SessionPath::new(Path::new(&format!(
                "/a/{}",
                "n".repeat(MAX_NAME_BYTES - 17)
            )))
            .is_ok()
        );
        let long_path = format!("{}/stage", "/dir".repeat(1100));
        assert!(refusal(&long_path).ends_with("it is too long to carry a session record"));
    }
}
