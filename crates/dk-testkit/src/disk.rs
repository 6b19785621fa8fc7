//! A small file system of a test's own, to fill: a tmpfs of a few MiB
//! mounted on a directory of the test's, unmounted on drop. Mounting takes
//! root: elsewhere a test that asks is skipped, saying so, unless
//! `DK_REQUIRE_PEERS` is set.

use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The file [`SmallDisk::fill`] fills the disk with.
const FILLER: &str = "filler";

/// A tmpfs mounted on a directory, unmounted when dropped (lazily, should
/// a process still hold it).
#[derive(Debug)]
pub struct SmallDisk {
    path: PathBuf,
}

impl SmallDisk {
    /// Mounts a tmpfs of `mib` MiB (mode 0700, root's) on `path`, made
    /// first when missing; `None`, after a line saying `test` is skipped,
    /// when the tests do not run as root or the mount is refused.
    ///
    /// # Panics
    ///
    /// When it cannot be mounted and `DK_REQUIRE_PEERS` is set.
    pub fn mount(test: &str, path: &Path, mib: u32) -> Option<SmallDisk> {
        let what = "a tmpfs of its own (the tests run as root to mount one)";
        if !rustix::process::geteuid().is_root() {
            return crate::peer_or_skip(test, what, None);
        }
        if let Err(error) = std::fs::create_dir_all(path) {
            crate::peers::fail(&format!("cannot make `{}`: {error}", path.display()));
        }
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={mib}m,mode=0700"))
            .arg("dk-test")
            .arg(path)
            .status()
            .is_ok_and(|status| status.success());
        let disk = mounted.then(|| SmallDisk {
            path: path.to_owned(),
        });
        crate::peer_or_skip(test, what, disk)
    }

    /// Where it is mounted.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Fills it: a file of its own takes every byte left (until the file
    /// system refuses more). The bytes it took.
    ///
    /// # Panics
    ///
    /// When the file cannot be made or a write fails otherwise.
    pub fn fill(&self) -> u64 {
        let file = self.path.join(FILLER);
        let mut filler = match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&file)
        {
            Ok(filler) => filler,
            Err(error) => crate::peers::fail(&format!("cannot make `{}`: {error}", file.display())),
        };
        let chunk = [0x5a_u8; 4096];
        let mut written = 0_u64;
        loop {
            match filler.write(&chunk) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(error) if error.kind() == ErrorKind::StorageFull => break,
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                Err(error) => {
                    crate::peers::fail(&format!("cannot fill `{}`: {error}", file.display()))
                }
            }
        }
        written
    }

    /// Frees what [`SmallDisk::fill`] took.
    pub fn free(&self) {
        let _ = std::fs::remove_file(self.path.join(FILLER));
    }

    /// The bytes free on it now.
    #[must_use]
    pub fn free_bytes(&self) -> u64 {
        rustix::fs::statvfs(&self.path)
            .map_or(0, |stat| stat.f_bavail.saturating_mul(stat.f_frsize))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let unmounted = Command::new("umount")
            .arg(&self.path)
            .status()
            .is_ok_and(|status| status.success());
        if !unmounted {
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
    }
}
