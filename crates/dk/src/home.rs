//! Where dk keeps its files, so that every command finds the same vessel
//! from any directory: one home, `DK_HOME` when set, else
//! `$XDG_DATA_HOME/dk`, else `$HOME/.local/share/dk`, made with mode 0700.
//! In it: `vessel/`, the vessel's data directory (0700: `vessel.db`,
//! `vessel.json`, `admin.sock`, `mcp.sock`), and the secrets, outside it:
//! `admin-token` and `vessel.key` (0600). `--data-dir`,
//! `--admin-token-file` and `dk vessel --vessel-key-file` override them.

use std::path::{Path, PathBuf};

/// dk's home, how it was found and why none could be: dk-device's, where
/// every device program finds its key file too.
pub use dk_device::{Home, HomeError, HomeSource as Source};

/// The vessel's data directory in the home.
const VESSEL_DIR: &str = "vessel";
/// The admin token's file in the home.
const ADMIN_TOKEN_FILE: &str = "admin-token";
/// The vessel's files in its data directory: its database and its admin
/// and MCP sockets.
pub use dk_vessel::{ADMIN_SOCKET, DATABASE_FILE, MCP_SOCKET};

/// `data_dir` when given, else the home's data directory (and the home).
pub fn data_dir_or_home(data_dir: Option<&Path>) -> Result<(PathBuf, Option<Home>), HomeError> {
    match data_dir {
        Some(dir) => Ok((dir.to_owned(), None)),
        None => Home::locate().map(|home| (home.root().join(VESSEL_DIR), Some(home))),
    }
}

/// What to say when no vessel answers in `data_dir`, found through `home`
/// or given.
pub fn no_vessel(data_dir: &Path, home: Option<&Home>) -> String {
    let how = match home {
        Some(home) if home.source() == Source::Env => {
            "start one with `dk vessel` and the same DK_HOME"
        }
        Some(_) => "start one with `dk vessel`, or set DK_HOME to the home of the one you run",
        None => "start one with `dk vessel --data-dir` naming this directory",
    };
    format!("no vessel runs in `{}` ({how})", data_dir.display())
}

/// The files one command uses: the flags' when given, else the home's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    /// The vessel's data directory.
    pub data_dir: PathBuf,
    /// The admin token's file.
    pub admin_token_file: PathBuf,
    /// The home, when either path comes from it.
    pub home: Option<Home>,
}

impl Paths {
    /// `data_dir` and `admin_token_file` as given, the missing ones from
    /// the home.
    pub fn resolve(
        data_dir: Option<&Path>,
        admin_token_file: Option<&Path>,
    ) -> Result<Paths, HomeError> {
        Paths::resolve_with(data_dir, admin_token_file, Home::locate)
    }

    fn resolve_with(
        data_dir: Option<&Path>,
        admin_token_file: Option<&Path>,
        locate: impl FnOnce() -> Result<Home, HomeError>,
    ) -> Result<Paths, HomeError> {
        let home = match (data_dir, admin_token_file) {
            (Some(_), Some(_)) => None,
            _ => Some(locate()?),
        };
        let from_home = |name: &str| home.as_ref().map(|h| h.root().join(name));
        Ok(Paths {
            data_dir: data_dir
                .map(Path::to_owned)
                .or_else(|| from_home(VESSEL_DIR))
                .unwrap_or_default(),
            admin_token_file: admin_token_file
                .map(Path::to_owned)
                .or_else(|| from_home(ADMIN_TOKEN_FILE))
                .unwrap_or_default(),
            home,
        })
    }

    /// The admin API's socket.
    pub fn admin_socket(&self) -> PathBuf {
        self.data_dir.join(ADMIN_SOCKET)
    }

    /// What to say when no vessel answers in the data directory.
    pub fn no_vessel(&self) -> String {
        no_vessel(&self.data_dir, self.home.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::{Home, HomeError, Paths};
    use std::path::Path;

    #[test]
    fn flags_win_and_the_home_fills_the_rest() {
        let home = || Home::from_env(|name| (name == "DK_HOME").then(|| "/h".into()));
        let nowhere = || Err(HomeError::Unknown);
        let got = Paths::resolve_with(Some(Path::new("d")), Some(Path::new("t")), nowhere);
        assert_eq!(
            got.map(|p| (p.data_dir, p.admin_token_file, p.home.is_none())),
            Ok(("d".into(), "t".into(), true))
        );
        let got = Paths::resolve_with(None, None, home).unwrap();
        assert_eq!(
            (got.data_dir, got.admin_token_file),
            ("/h/vessel".into(), "/h/admin-token".into())
        );
        let got = Paths::resolve_with(Some(Path::new("d")), None, home).unwrap();
        assert_eq!(
            (got.data_dir, got.admin_token_file),
            ("d".into(), "/h/admin-token".into())
        );
        assert_eq!(
            Paths::resolve_with(None, Some(Path::new("t")), nowhere),
            Err(HomeError::Unknown)
        );
    }
}
