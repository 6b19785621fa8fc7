//! Unix sockets in a private directory, which prove to a client that the
//! vessel listening there is this user's.

use std::fs::Permissions;
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

use dk_files::private::{kind_of, owned};

pub(crate) use dk_files::private::{PrivateFileError, read_private_file, write_private_file};

/// Binds a Unix socket at `path` with mode 0600, for a directory made with
/// [`ensure_private_dir`](dk_files::private::ensure_private_dir). A socket left there by a vessel that did not stop
/// cleanly (nothing answers on it) is removed first; one that answers means
/// another vessel runs in the directory, and is left alone. Call it within a
/// Tokio runtime.
pub async fn bind_private_socket(
    path: &Path,
) -> Result<tokio::net::UnixListener, PrivateFileError> {
    let dir = path.parent().unwrap_or(Path::new(".")).to_owned();
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            owned(path, &meta)?;
            match tokio::net::UnixStream::connect(path).await {
                Ok(_) => return Err(PrivateFileError::AlreadyRunning { dir }),
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    std::fs::remove_file(path).map_err(|e| PrivateFileError::io(path, e))?;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(PrivateFileError::io(path, e)),
            }
        }
        Ok(meta) => {
            return Err(PrivateFileError::WrongKind {
                path: path.to_owned(),
                expected: "a socket",
                found: kind_of(&meta.file_type()),
            });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(PrivateFileError::io(path, e)),
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(|e| {
        if e.kind() == io::ErrorKind::AddrInUse {
            // Another vessel bound it since the check above.
            PrivateFileError::AlreadyRunning { dir: dir.clone() }
        } else {
            PrivateFileError::io(path, e)
        }
    })?;
    std::fs::set_permissions(path, Permissions::from_mode(0o600))
        .map_err(|e| PrivateFileError::io(path, e))?;
    Ok(listener)
}

/// Connects to the Unix socket at `path` once it is shown to be a socket
/// owned by this user: only this user's vessel can have made it.
pub async fn connect_private_socket(
    path: &Path,
) -> Result<tokio::net::UnixStream, PrivateFileError> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| PrivateFileError::io(path, e))?;
    if !meta.file_type().is_socket() {
        return Err(PrivateFileError::WrongKind {
            path: path.to_owned(),
            expected: "a socket",
            found: kind_of(&meta.file_type()),
        });
    }
    owned(path, &meta)?;
    tokio::net::UnixStream::connect(path)
        .await
        .map_err(|e| PrivateFileError::io(path, e))
}
