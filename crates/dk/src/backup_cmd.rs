//! `dk backup` and `dk restore`: a consistent copy of a vessel's database
//! taken while it runs (SQLite's online backup, never a copy of the live
//! files), its audit chain verified; and a backup put back in place as the
//! database of a stopped vessel, refused unless its chain verifies.
//!
//! The database holds no secret (docs/STORAGE.md): the vessel's key, the
//! admin token and the audit key are kept outside the data directory, so a
//! backup never holds them.

use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use dk_store::{AuditHead, AuditKey, RestoreError, SqliteStore, Store, StoreError};

use crate::audit_cmd::{Kept, Whose, head_file, open, verify};
use crate::home::{ADMIN_SOCKET, DATABASE_FILE, MCP_SOCKET, data_dir_or_home};
use crate::input::printable;

/// Arguments of `dk backup`.
#[derive(clap::Args)]
pub struct BackupArgs {
    /// Where to write the backup (a new file, unless `--force`).
    file: PathBuf,
    /// The vessel's data directory. [default: `vessel` in dk's home]
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Replace FILE if it exists.
    #[arg(long)]
    force: bool,
    /// Where the vessel keeps the log's head, checked against the copy.
    /// [default: beside the data directory, `DIR.audit-head`]
    #[arg(long, value_name = "FILE")]
    audit_head_file: Option<PathBuf>,
    /// The key of a keyed chain (the file given to `dk vessel
    /// --audit-key-file`), to check the copy's chain with.
    #[arg(long, value_name = "FILE")]
    audit_key_file: Option<PathBuf>,
}

/// Arguments of `dk restore`.
#[derive(clap::Args)]
pub struct RestoreArgs {
    /// The backup, written by `dk backup`.
    file: PathBuf,
    /// The data directory of the vessel to restore (which must not be
    /// running). [default: `vessel` in dk's home]
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Where the vessel keeps the log's head: replaced with the backup's.
    /// [default: beside the data directory, `DIR.audit-head`]
    #[arg(long, value_name = "FILE")]
    audit_head_file: Option<PathBuf>,
    /// A head kept from the backup (`SEQ:HASH`, as `dk backup` printed it):
    /// the backup's log must still hold that entry unchanged.
    #[arg(long)]
    expect_head: Option<String>,
    /// The key of a keyed chain (the file given to `dk vessel
    /// --audit-key-file`).
    #[arg(long, value_name = "FILE")]
    audit_key_file: Option<PathBuf>,
}

/// Runs `dk backup`.
pub fn backup(args: &BackupArgs) -> ExitCode {
    let prepared = (|| {
        let (data_dir, _) =
            data_dir_or_home(args.data_dir.as_deref()).map_err(|e| e.to_string())?;
        let key = load_key(args.audit_key_file.as_deref())?;
        // The head is read before the copy, so entries committed meanwhile
        // are never taken for a cut.
        let kept = match Kept::read(head_file(&data_dir, args.audit_head_file.as_deref())?)
            .map_err(|e| e.to_string())?
        {
            Kept::Missing(_) => Kept::NotAsked,
            kept => kept,
        };
        let store = open(&data_dir)?;
        store
            .backup_to(&args.file, args.force)
            .map_err(|e| match e {
                StoreError::InvalidInput(_) => format!(
                    "`{}` already exists: give --force to replace it",
                    args.file.display()
                ),
                // Named for FILE, not for the hidden file the copy is
                // written to first.
                StoreError::Open { reason, .. } => format!(
                    "cannot write the backup to `{}`: {reason}",
                    args.file.display()
                ),
                other => other.to_string(),
            })?;
        println!(
            "{}",
            printable(&format!(
                "backup of {} written to {}",
                data_dir.join(DATABASE_FILE).display(),
                args.file.display()
            ))
        );
        Ok::<_, String>((kept, key))
    })();
    let (kept, key) = match prepared {
        Ok(prepared) => prepared,
        Err(e) => {
            eprintln!("error: {}", printable(&e));
            return ExitCode::FAILURE;
        }
    };
    let key = key.zip(args.audit_key_file.clone()).map(|(k, f)| (f, k));
    let verified = verify(&args.file, &kept, key.as_ref(), Whose::Backup, false);
    if verified != ExitCode::SUCCESS {
        eprintln!(
            "error: the backup's audit log does not verify (nor, then, does the vessel's): `dk audit verify` on the data directory says more"
        );
    }
    verified
}

/// Why `dk restore` restored nothing: what went wrong, and the problems
/// found in the backup's log, each told on a line of its own.
struct Refusal {
    said: String,
    problems: Vec<String>,
}

impl From<String> for Refusal {
    fn from(said: String) -> Refusal {
        Refusal {
            said,
            problems: Vec::new(),
        }
    }
}

/// Runs `dk restore`.
pub fn restore(args: &RestoreArgs) -> ExitCode {
    match restore_inner(args) {
        Ok(said) => {
            println!("{}", printable(&said));
            ExitCode::SUCCESS
        }
        Err(refusal) => {
            eprintln!("error: {}", printable(&refusal.said));
            for problem in &refusal.problems {
                eprintln!("  {}", printable(problem));
            }
            ExitCode::FAILURE
        }
    }
}

/// Refuses a backup file that is not there to read, before anything else.
fn readable_backup(file: &Path) -> Result<(), String> {
    match std::fs::metadata(file) {
        Ok(meta) if meta.is_file() => Ok(()),
        Ok(_) => Err(format!(
            "`{}` is not a file: give the file `dk backup` wrote",
            file.display()
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            Err(format!("there is no backup at `{}`", file.display()))
        }
        Err(e) => Err(format!("cannot read the backup `{}`: {e}", file.display())),
    }
}

fn restore_inner(args: &RestoreArgs) -> Result<String, Refusal> {
    readable_backup(&args.file)?;
    let (data_dir, _) = data_dir_or_home(args.data_dir.as_deref()).map_err(|e| e.to_string())?;
    refuse_running(&data_dir)?;
    let key = load_key(args.audit_key_file.as_deref())?;
    let expect: Option<AuditHead> = match &args.expect_head {
        None => None,
        Some(text) => Some(text.parse().map_err(|e| format!("--expect-head: {e}"))?),
    };
    let head_file = head_file(&data_dir, args.audit_head_file.as_deref())?;
    let db = data_dir.join(DATABASE_FILE);
    let mut head = None;
    let mut problems = Vec::new();
    SqliteStore::restore_from(&args.file, &db, |store| {
        let report = store
            .verify_audit_with(key.as_ref(), expect.as_ref())
            .map_err(|e| e.to_string())?;
        if !report.is_intact() {
            problems = report.problems.iter().map(ToString::to_string).collect();
            return Err(format!(
                "the audit log of `{}` does not verify, nothing was restored:",
                args.file.display()
            ));
        }
        head = Some(store.audit_head().map_err(|e| e.to_string())?);
        Ok(())
    })
    .map_err(|e| match e {
        RestoreError::Refused(said) => Refusal { said, problems },
        RestoreError::Store(e) => e.to_string().into(),
    })?;
    let Some(head) = head else {
        return Err("the backup's audit head could not be read"
            .to_owned()
            .into());
    };
    head.write_to(&head_file).map_err(|e| {
        format!(
            "restored `{}`, but its audit head could not be written to `{}`: {e}",
            db.display(),
            head_file.display()
        )
    })?;
    Ok(format!(
        "restored {} into {}: audit log intact, {} entries, head {head} (kept in {}); start the vessel with its key file",
        args.file.display(),
        db.display(),
        head.seq,
        head_file.display()
    ))
}

/// Refuses a data directory a vessel is running on: one of its sockets
/// answers (a vessel binds them before it opens its database).
fn refuse_running(data_dir: &Path) -> Result<(), String> {
    for socket in [ADMIN_SOCKET, MCP_SOCKET] {
        match UnixStream::connect(data_dir.join(socket)) {
            Ok(_) => {
                return Err(format!(
                    "a vessel is running on `{}`: stop it before restoring its database",
                    data_dir.display()
                ));
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                ) => {}
            Err(e) => {
                return Err(format!(
                    "cannot tell whether a vessel runs on `{}`: {e}",
                    data_dir.display()
                ));
            }
        }
    }
    Ok(())
}

fn load_key(file: Option<&Path>) -> Result<Option<AuditKey>, String> {
    file.map(AuditKey::load)
        .transpose()
        .map_err(|e| e.to_string())
}
