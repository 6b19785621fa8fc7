//! Where dk keeps its files, so that every command finds the same vessel
//! from any directory: one home, `DK_HOME` when set, else
//! `$XDG_DATA_HOME/dk`, else `$HOME/.local/share/dk`, made with mode 0700.
//! In it: `vessel/`, the vessel's data directory (0700: `vessel.db`,
//! `vessel.json`, `admin.sock`, `mcp.sock`), and the secrets, outside it:
//! `admin-token` and `vessel.key` (0600). `--data-dir`,
//! `--admin-token-file` and `dk vessel --vessel-key-file` override them.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

/// The environment variable naming dk's home.
pub const HOME_ENV: &str = "DK_HOME";
/// The vessel's data directory in the home.
const VESSEL_DIR: &str = "vessel";
/// The admin token's file in the home.
const ADMIN_TOKEN_FILE: &str = "admin-token";
/// The vessel's files in its data directory: its database and its admin
/// and MCP sockets.
pub use dk_vessel::{ADMIN_SOCKET, DATABASE_FILE, MCP_SOCKET};

/// How the home was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// From `DK_HOME`.
    Env,
    /// `$XDG_DATA_HOME/dk`, `DK_HOME` being unset.
    XdgDataHome,
    /// `$HOME/.local/share/dk`, both being unset.
    HomeDir,
}

/// dk's home directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Home {
    root: PathBuf,
    source: Source,
}

/// Why no home could be named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HomeError {
    /// `DK_HOME` is a relative path, which would name another directory
    /// from each working directory.
    Relative(PathBuf),
    /// None of `DK_HOME`, `XDG_DATA_HOME` and `HOME` names a directory.
    Unknown,
}

impl fmt::Display for HomeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HomeError::Relative(path) => write!(
                f,
                "{HOME_ENV} must be an absolute path, not `{}`",
                path.display()
            ),
            HomeError::Unknown => write!(
                f,
                "cannot tell where dk keeps its files: set {HOME_ENV} (or HOME)"
            ),
        }
    }
}

impl Home {
    /// The home this process's environment names.
    pub fn locate() -> Result<Home, HomeError> {
        Home::from_env(|name| std::env::var_os(name))
    }

    /// The home `var` names: `DK_HOME` (absolute) when set and not empty,
    /// else `$XDG_DATA_HOME/dk` when that is absolute (the XDG rule: a
    /// relative one is ignored), else `$HOME/.local/share/dk`.
    fn from_env(var: impl Fn(&str) -> Option<OsString>) -> Result<Home, HomeError> {
        let set = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        if let Some(root) = set(HOME_ENV) {
            if !root.is_absolute() {
                return Err(HomeError::Relative(root));
            }
            return Ok(Home {
                root,
                source: Source::Env,
            });
        }
        if let Some(data) = set("XDG_DATA_HOME").filter(|p| p.is_absolute()) {
            return Ok(Home {
                root: data.join("dk"),
                source: Source::XdgDataHome,
            });
        }
        match set("HOME").filter(|p| p.is_absolute()) {
            Some(home) => Ok(Home {
                root: home.join(".local").join("share").join("dk"),
                source: Source::HomeDir,
            }),
            None => Err(HomeError::Unknown),
        }
    }

    /// The home directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// How it was found, in words, for the vessel's start text.
    pub fn found_through(&self) -> &'static str {
        match self.source {
            Source::Env => "from DK_HOME",
            Source::XdgDataHome => "$XDG_DATA_HOME/dk, as DK_HOME is unset",
            Source::HomeDir => "the default, as DK_HOME and XDG_DATA_HOME are unset",
        }
    }
}

/// `data_dir` when given, else the home's data directory (and the home).
pub fn data_dir_or_home(data_dir: Option<&Path>) -> Result<(PathBuf, Option<Home>), HomeError> {
    match data_dir {
        Some(dir) => Ok((dir.to_owned(), None)),
        None => Home::locate().map(|home| (home.root.join(VESSEL_DIR), Some(home))),
    }
}

/// What to say when no vessel answers in `data_dir`, found through `home`
/// or given.
pub fn no_vessel(data_dir: &Path, home: Option<&Home>) -> String {
    let how = match home {
        Some(home) if home.source == Source::Env => {
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
        let from_home = |name: &str| home.as_ref().map(|h| h.root.join(name));
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
    use super::{Home, HomeError, Paths, Source};
    use std::path::{Path, PathBuf};

    #[track_caller]
    fn check(env: &[(&str, &str)], expected: Result<(&str, Source), HomeError>) {
        let got = Home::from_env(|name| {
            env.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).into())
        });
        let expected = expected.map(|(root, source)| Home {
            root: PathBuf::from(root),
            source,
        });
        assert_eq!(got, expected, "{env:?}");
    }

    #[test]
    fn the_home_is_dk_home_then_xdg_then_home() {
        use Source::{Env, HomeDir, XdgDataHome};
        let all = [("DK_HOME", "/d"), ("XDG_DATA_HOME", "/x"), ("HOME", "/h")];
        check(&all, Ok(("/d", Env)));
        check(&all[1..], Ok(("/x/dk", XdgDataHome)));
        check(&all[2..], Ok(("/h/.local/share/dk", HomeDir)));
        check(
            &[("DK_HOME", ""), ("XDG_DATA_HOME", ""), ("HOME", "/h")],
            Ok(("/h/.local/share/dk", HomeDir)),
        );
        check(
            &[("XDG_DATA_HOME", "relative"), ("HOME", "/h")],
            Ok(("/h/.local/share/dk", HomeDir)),
        );
        check(
            &[("DK_HOME", "here"), ("HOME", "/h")],
            Err(HomeError::Relative("here".into())),
        );
        check(&[], Err(HomeError::Unknown));
        check(&[("HOME", "h")], Err(HomeError::Unknown));
    }

    #[test]
    fn flags_win_and_the_home_fills_the_rest() {
        let home = || {
            Ok(Home {
                root: "/h".into(),
                source: Source::Env,
            })
        };
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
