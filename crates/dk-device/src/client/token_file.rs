//! The token file: a device token read back at every connection, written
//! whole or not at all with mode 0600.

use std::fs::File;
#[cfg(not(unix))]
use std::io::Write as _;
use std::io::{self, Read as _};
use std::path::{Path, PathBuf};

use dk_device_core::{MAX_TOKEN_BYTES, is_token};

use super::error::ClientError;

pub(super) fn token_file_error(path: &Option<PathBuf>, source: io::Error) -> ClientError {
    ClientError::TokenFile {
        path: path.clone().unwrap_or_default(),
        source,
    }
}

/// The token in `path`; `None` when the file is missing or blank.
pub(super) fn read_token(path: &Path) -> io::Result<Option<String>> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    warn_if_readable_by_others(&file, path);
    let mut bytes = Vec::new();
    let limit = u64::try_from(MAX_TOKEN_BYTES)
        .unwrap_or(u64::MAX)
        .saturating_add(8);
    file.take(limit).read_to_end(&mut bytes)?;
    let not_a_token = || io::Error::new(io::ErrorKind::InvalidData, "does not hold a device token");
    let text = std::str::from_utf8(&bytes).map_err(|_| not_a_token())?;
    let token = text.trim();
    if token.is_empty() {
        return Ok(None);
    }
    if !is_token(token) {
        return Err(not_a_token());
    }
    Ok(Some(token.to_owned()))
}

#[cfg(unix)]
pub(super) fn warn_if_readable_by_others(file: &File, path: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    if let Ok(metadata) = file.metadata()
        && metadata.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(path = %path.display(), "the token file is readable by others: chmod 600 it");
    }
}

#[cfg(not(unix))]
pub(super) fn warn_if_readable_by_others(_file: &File, _path: &Path) {}

/// Writes `token` to `path` through a temporary file in the same directory
/// renamed over it, so the file holds the whole token or its old content.
pub(super) fn write_token(path: &Path, token: &str) -> io::Result<()> {
    write_private(path, format!("{token}\n").as_bytes())
}

/// Writes `bytes` to `path` (mode 0600, its directory 0700 when created)
/// through a temporary file in the same directory renamed over it, so the
/// file holds the whole new content or its old one: dk-files'
/// `write_private_file`, the vessel's own.
#[cfg(unix)]
pub(super) fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    dk_files::private::write_private_file(path, bytes).map_err(io::Error::from)
}

/// Writes `bytes` to `path` through a temporary file in the same directory
/// renamed over it, so the file holds the whole new content or its old one.
#[cfg(not(unix))]
pub(super) fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "names no file"))?;
    std::fs::DirBuilder::new().recursive(true).create(&dir)?;
    let temp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        dk_files::hex::random(8)
    ));
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written
}
