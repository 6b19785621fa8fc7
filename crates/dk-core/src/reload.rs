//! Reloading the `device_use` rule file while the vessel runs: on a change
//! of the file (the host watches it: `dk_vessel::reload::watch_policy_file`),
//! when asked (SIGHUP in `dk vessel`), or through the admin API (`dk policy
//! reload`). A new file that does not load is refused
//! whole; the rules in force stay. Every reload, applied or refused, is an
//! audit entry naming the file and the SHA-256 of what was read, so the log
//! answers "which rules were in force" (with the vessel's `vessel-started`
//! and `vessel-stopped` entries, which carry [`RulesInForce`] too).
//!
//! The core opens no file: the host reads it ([`RuleReader`], given with
//! the [`RuleFile`] and with each [`Vessel::reload_rules_from`]), the core
//! parses what was read, digests it, applies it and records it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError};

use dk_policy::{PolicyFileError, PolicySet};
use sha2::{Digest, Sha256};

use crate::store::entry as schema;
use crate::vessel::{RuleSource, Vessel};

/// How the host reads a rule file's text: the text of the file at a path,
/// or why it cannot be read (`dk_vessel` reads it from disk with
/// `dk_policy::read_rule_file`). The core keeps it to read the file again
/// on a reload, and opens no file itself.
pub type RuleReader = Arc<dyn Fn(&Path) -> Result<String, PolicyFileError> + Send + Sync>;

/// A rule file read and parsed, with the SHA-256 of the bytes read and the
/// reader that reads it again on a reload.
pub struct RuleFile {
    path: PathBuf,
    sha256: String,
    set: PolicySet,
    reader: RuleReader,
}

impl fmt::Debug for RuleFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RuleFile")
            .field("path", &self.path)
            .field("sha256", &self.sha256)
            .field("set", &self.set)
            .finish_non_exhaustive()
    }
}

impl RuleFile {
    /// Reads the rule file at `path` with `reader` and parses it. Any
    /// error refuses the whole file, with every error reported.
    pub fn read(path: &Path, reader: RuleReader) -> Result<RuleFile, PolicyFileError> {
        let text = reader(path)?;
        Ok(RuleFile {
            path: path.to_owned(),
            sha256: digest(&text),
            set: PolicySet::from_yaml_str(&text)?,
            reader,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The SHA-256 of the bytes read, as 64 lower-case hex characters.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// The rules.
    pub fn policies(&self) -> &PolicySet {
        &self.set
    }

    /// The rules, taken.
    pub fn into_policies(self) -> PolicySet {
        self.set
    }
}

/// The digest of the file's text when `reader` could read it, and its rules.
fn read(path: &Path, reader: &RuleReader) -> (Option<String>, Result<PolicySet, PolicyFileError>) {
    match reader(path) {
        Ok(text) => (Some(digest(&text)), PolicySet::from_yaml_str(&text)),
        Err(e) => (None, Err(e)),
    }
}

/// The SHA-256 of a rule file's text, as 64 lower-case hex characters.
fn digest(text: &str) -> String {
    dk_files::hex::encode(&Sha256::digest(text.as_bytes()))
}

pub use crate::store::entry::{ReloadCause, RulesInForce};

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reloaded {
    /// The new rules are in force.
    Applied {
        /// How many rules the new file holds.
        rules: usize,
        /// The SHA-256 of the file's bytes.
        sha256: String,
    },
    /// The file was touched but holds the rules in force, byte for byte:
    /// nothing was done or recorded.
    Unchanged,
    /// The new file was refused; the previous rules stay in force.
    Refused {
        /// Every error in the new file, one per line.
        errors: String,
    },
}

impl Vessel {
    /// Puts `file`'s rules in force and remembers where they came from (for
    /// [`Vessel::reload_rules`] and [`Vessel::rules_in_force`]).
    pub fn use_rule_file(&self, file: RuleFile) {
        let mut source = self.source();
        self.adapter().set_policies(Arc::new(file.set));
        *source = RuleSource {
            file: Some(file.path),
            sha256: Some(file.sha256),
            reader: Some(file.reader),
        };
    }

    /// The rules in force: their file and digest, when they came from one.
    pub fn rules_in_force(&self) -> RulesInForce {
        let source = self.source();
        self.in_force(&source)
    }

    fn in_force(&self, source: &RuleSource) -> RulesInForce {
        RulesInForce {
            file: source.file.as_ref().map(|p| p.display().to_string()),
            sha256: source.sha256.clone(),
            rules: self.adapter().policies().rules().len(),
        }
    }

    fn source(&self) -> std::sync::MutexGuard<'_, RuleSource> {
        // Whole between statements: nothing in a reload panics.
        self.rule_source
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads the rule file in force again (with the reader it was read
    /// with) and, if it is good, puts its rules in force for the calls that
    /// reach check 3 from now on; a broken file changes nothing. Recorded
    /// either way (`rules-reloaded` or `rules-refused`). `None` when the
    /// rules came from no file.
    pub fn reload_rules(&self, cause: ReloadCause) -> Option<Reloaded> {
        let (file, reader) = {
            let source = self.source();
            (source.file.clone()?, Arc::clone(source.reader.as_ref()?))
        };
        Some(self.reload_rules_from(&file, reader, cause))
    }

    /// Reads `path` with `reader` and, if it is good, puts its rules in
    /// force, `path` becoming the rule file (read with `reader` from now
    /// on); a broken file changes nothing. Recorded either way; a file
    /// changed only in its time, holding the rules in force byte for byte,
    /// is [`Reloaded::Unchanged`] and not recorded.
    pub fn reload_rules_from(
        &self,
        path: &Path,
        reader: RuleReader,
        cause: ReloadCause,
    ) -> Reloaded {
        let mut source = self.source();
        let (sha256, loaded) = read(path, &reader);
        let file = path.display().to_string();
        match (loaded, sha256) {
            (Ok(_), Some(sha256))
                if cause == ReloadCause::FileChanged
                    && source.sha256.as_deref() == Some(sha256.as_str())
                    && source.file.as_deref() == Some(path) =>
            {
                Reloaded::Unchanged
            }
            (Ok(set), Some(sha256)) => {
                let rules = set.rules().len();
                self.adapter().set_policies(Arc::new(set));
                *source = RuleSource {
                    file: Some(path.to_owned()),
                    sha256: Some(sha256.clone()),
                    reader: Some(reader),
                };
                self.record(schema::RulesReloaded {
                    file,
                    sha256: sha256.clone(),
                    rules,
                    cause,
                });
                Reloaded::Applied { rules, sha256 }
            }
            (Ok(_), None) => Reloaded::Refused {
                errors: "the file was read but not its digest".to_owned(),
            },
            (Err(e), sha256) => {
                let errors = e.to_string();
                self.record(schema::RulesRefused {
                    file,
                    sha256,
                    errors: errors.clone(),
                    cause,
                    in_force: self.in_force(&source),
                });
                Reloaded::Refused { errors }
            }
        }
    }
}

#[cfg(test)]
mod tests;
