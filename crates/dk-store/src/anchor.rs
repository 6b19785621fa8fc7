//! The audit chain's head kept outside the database: a small file holding
//! `SEQ:HASH` of the last committed entry, rewritten after every commit
//! that appends (atomically: a new file under a random name, created
//! exclusively with mode 0600, synced, then renamed over the old one).
//! A `HeadKeeper` thread (`keeper.rs`) does the writing, so a commit does not wait for
//! a second disk sync: the file may lag the log by the commits of the last
//! tenth of a second (coalesced into one write), never run ahead of it,
//! and is up to date once the keeper is dropped.
//!
//! By default it lies beside the data directory, not in it:
//! `<parent>/<name>.audit-head` for a data directory `<parent>/<name>`
//! ([`audit_head_file`]), so copying or replacing the data directory does
//! not carry it along. Against it, entries cut off the end of the log, and a
//! chain rewritten with recomputed hashes, are found.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::{AuditHead, Cause, StoreError};

/// The largest head file read: `SEQ:HASH` and a newline fit many times.
const MAX_HEAD_FILE: u64 = 1024;

/// Where the audit head of the data directory `data_dir` is kept by
/// default: beside it, `<parent>/<name>.audit-head` (for
/// `~/.local/share/dk/vessel`, `~/.local/share/dk/vessel.audit-head`).
/// `None` for a path without a final name (such as `/`).
pub fn audit_head_file(data_dir: &Path) -> Option<PathBuf> {
    let name = data_dir.file_name()?;
    let mut file = name.to_owned();
    file.push(".audit-head");
    Some(data_dir.with_file_name(file))
}

impl fmt::Display for AuditHead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.seq, self.hash)
    }
}

/// Why a text is not an [`AuditHead`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an audit head is SEQ:HASH, a number and 64 lower-case hex characters")]
pub struct HeadSyntaxError;

impl FromStr for AuditHead {
    type Err = HeadSyntaxError;

    /// `SEQ:HASH`, surrounding white space ignored.
    fn from_str(text: &str) -> Result<AuditHead, HeadSyntaxError> {
        let (seq, hash) = text.trim().split_once(':').ok_or(HeadSyntaxError)?;
        let seq = seq.parse().map_err(|_| HeadSyntaxError)?;
        let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
        if hash.len() != 64 || !hash.bytes().all(hex) {
            return Err(HeadSyntaxError);
        }
        Ok(AuditHead {
            seq,
            hash: hash.to_owned(),
        })
    }
}

impl AuditHead {
    /// The head kept in `path`, or `None` when there is no such file. A
    /// file that is not a regular file, cannot be read or does not hold
    /// `SEQ:HASH` is an error.
    pub fn read_from(path: &Path) -> Result<Option<AuditHead>, StoreError> {
        let refused = |reason: Cause| StoreError::HeadFile {
            path: path.display().to_string(),
            reason,
        };
        let metadata = match std::fs::symlink_metadata(path) {
            Ok(metadata) => metadata,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(refused(Cause::new(error))),
        };
        if !metadata.is_file() {
            return Err(refused(Cause::msg("it is not a regular file")));
        }
        if metadata.len() > MAX_HEAD_FILE {
            return Err(refused(Cause::msg(format!(
                "it is {} bytes long",
                metadata.len()
            ))));
        }
        let text = std::fs::read_to_string(path).map_err(|e| refused(Cause::new(e)))?;
        text.parse()
            .map(Some)
            .map_err(|error: HeadSyntaxError| refused(Cause::new(error)))
    }

    /// Keeps this head in `path`, replacing what was there at once, mode
    /// 0600, never through a link (see `dk_files::private::write_private_file`).
    pub fn write_to(&self, path: &Path) -> std::io::Result<()> {
        dk_files::private::write_private_file(path, format!("{self}\n").as_bytes())
            .map_err(std::io::Error::from)
    }
}
