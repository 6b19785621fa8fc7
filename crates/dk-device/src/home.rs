//! Where dk keeps its files on this machine, so that every program finds
//! the same ones from any directory: one home, `DK_HOME` when set, else
//! `$XDG_DATA_HOME/dk`, else `$HOME/.local/share/dk`. A device's key (or
//! v1 token) is `devices/<id>.key` (`.token`) in it, [`Home::device_file`]:
//! where `dk device simulate`, `dk bridge mqtt` and the Python SDK keep
//! theirs. The `dk` command keeps its vessel's files there too.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The environment variable naming dk's home.
pub const HOME_ENV: &str = "DK_HOME";

/// The folder of the home holding devices' key and token files.
const DEVICES_DIR: &str = "devices";

/// How the home was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HomeSource {
    /// From `DK_HOME`.
    Env,
    /// `$XDG_DATA_HOME/dk`, `DK_HOME` being unset.
    XdgDataHome,
    /// `$HOME/.local/share/dk`, both being unset.
    HomeDir,
}

/// dk's home directory on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Home {
    root: PathBuf,
    source: HomeSource,
}

/// Why no home could be named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HomeError {
    /// `DK_HOME` is a relative path, which would name another directory
    /// from each working directory.
    #[error("{HOME_ENV} must be an absolute path, not `{}`", .0.display())]
    Relative(PathBuf),
    /// None of `DK_HOME`, `XDG_DATA_HOME` and `HOME` names a directory.
    #[error("cannot tell where dk keeps its files: set {HOME_ENV} (or HOME)")]
    Unknown,
}

impl Home {
    /// The home this process's environment names.
    pub fn locate() -> Result<Home, HomeError> {
        Home::from_env(|name| std::env::var_os(name))
    }

    /// The home `var` names: `DK_HOME` (absolute) when set and not empty,
    /// else `$XDG_DATA_HOME/dk` when that is absolute (the XDG rule: a
    /// relative one is ignored), else `$HOME/.local/share/dk`.
    pub fn from_env(var: impl Fn(&str) -> Option<OsString>) -> Result<Home, HomeError> {
        let set = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        if let Some(root) = set(HOME_ENV) {
            if !root.is_absolute() {
                return Err(HomeError::Relative(root));
            }
            return Ok(Home {
                root,
                source: HomeSource::Env,
            });
        }
        if let Some(data) = set("XDG_DATA_HOME").filter(|p| p.is_absolute()) {
            return Ok(Home {
                root: data.join("dk"),
                source: HomeSource::XdgDataHome,
            });
        }
        match set("HOME").filter(|p| p.is_absolute()) {
            Some(home) => Ok(Home {
                root: home.join(".local").join("share").join("dk"),
                source: HomeSource::HomeDir,
            }),
            None => Err(HomeError::Unknown),
        }
    }

    /// The home directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// How it was found.
    pub fn source(&self) -> HomeSource {
        self.source
    }

    /// How it was found, in words, for a program's start text.
    pub fn found_through(&self) -> &'static str {
        match self.source {
            HomeSource::Env => "from DK_HOME",
            HomeSource::XdgDataHome => "$XDG_DATA_HOME/dk, as DK_HOME is unset",
            HomeSource::HomeDir => "the default, as DK_HOME and XDG_DATA_HOME are unset",
        }
    }

    /// The key (`ext` "key") or v1 token ("token") file of device `id`:
    /// `devices/<id>.<ext>` in the home. A validated manifest's id is a
    /// safe file name: lower-case words joined by `-`.
    pub fn device_file(&self, id: &str, ext: &str) -> PathBuf {
        self.root.join(DEVICES_DIR).join(format!("{id}.{ext}"))
    }
}

#[cfg(test)]
mod tests {
    use super::{Home, HomeError, HomeSource};
    use std::path::PathBuf;

    #[track_caller]
    fn check(env: &[(&str, &str)], expected: Result<(&str, HomeSource), HomeError>) {
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
        use HomeSource::{Env, HomeDir, XdgDataHome};
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
    fn a_device_keeps_its_files_in_the_homes_devices_folder() {
        let home = Home::from_env(|name| (name == "DK_HOME").then(|| "/d".into())).unwrap();
        assert_eq!(
            home.device_file("hall-thermostat", "key"),
            PathBuf::from("/d/devices/hall-thermostat.key")
        );
        assert_eq!(
            home.device_file("desk-lamp", "token"),
            PathBuf::from("/d/devices/desk-lamp.token")
        );
    }
}
