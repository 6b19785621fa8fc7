//! `dk audit tail` and `dk audit verify`: read a vessel's audit log straight
//! from its database (a running vessel keeps writing; reading is safe), and
//! how `dk vessel` opens its store to keep the log's head outside it and,
//! given a key file, to key the chain. With `--store postgres://...` each
//! reads the PostgreSQL store a fleet of vessels shares instead. The
//! commands that read open the store read-only: they migrate, key and write
//! nothing, and work on a store they may not write.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use dk_store::{
    AuditEntry, AuditHead, AuditKey, AuditOptions, PgOptions, PgStore, SqliteStore, Store,
    StoreError, VerifyReport, audit_head_file,
};
use serde_json::json;

use crate::home::{DATABASE_FILE, data_dir_or_home};
use crate::input::printable;

/// Audit commands.
#[derive(Subcommand)]
pub enum AuditCommand {
    /// Print the last entries, oldest first; `--follow` keeps printing new ones.
    Tail {
        /// The vessel's data directory. [default: `vessel` in dk's home]
        #[arg(long, conflicts_with = "store")]
        data_dir: Option<PathBuf>,
        /// Read the PostgreSQL store at this URL
        /// (`postgres://user:password@host:port/database`) instead of a
        /// data directory's database.
        #[arg(long, value_name = "URL", env = "DK_STORE", hide_env_values = true)]
        store: Option<String>,
        /// How many of the last entries to print first.
        #[arg(long, short = 'n', default_value_t = 20)]
        lines: u64,
        /// Keep printing entries as they are committed (Ctrl-C stops).
        #[arg(long)]
        follow: bool,
        /// One JSON object per line, with the raw time (`atMs`,
        /// milliseconds since the Unix epoch, UTC). Without it each entry's
        /// time is shown in local time with its UTC offset (the system's
        /// zone, or `TZ`: `TZ=UTC dk audit tail` for UTC).
        #[arg(long)]
        json: bool,
    },
    /// Check the hash chain, the log against the pairings, grants and agents
    /// it must account for, and the head kept outside the database; exit 0
    /// when intact, 1 saying what is wrong.
    Verify {
        /// The vessel's data directory. [default: `vessel` in dk's home]
        #[arg(long, conflicts_with = "store")]
        data_dir: Option<PathBuf>,
        /// Verify the PostgreSQL store at this URL
        /// (`postgres://user:password@host:port/database`) instead of a
        /// data directory's database. No head is kept beside it: give
        /// `--expect-head` or `--audit-head-file` to check against one.
        #[arg(long, value_name = "URL", env = "DK_STORE", hide_env_values = true)]
        store: Option<String>,
        /// Where the vessel keeps the log's head. [default: beside the data
        /// directory, `DIR.audit-head`]
        #[arg(long, value_name = "FILE")]
        audit_head_file: Option<PathBuf>,
        /// A head kept from an earlier verify (`SEQ:HASH`), instead of the
        /// head file.
        #[arg(long, conflicts_with_all = ["audit_head_file", "no_kept_head"])]
        expect_head: Option<String>,
        /// Check without a kept head: entries cut off the end, and a chain
        /// rewritten with recomputed hashes, then go unseen.
        #[arg(long)]
        no_kept_head: bool,
        /// The key of a keyed chain (the file given to `dk vessel
        /// --audit-key-file`): a keyed chain is checked only with it, and
        /// with it a chain rewritten without the key is named.
        #[arg(long, value_name = "FILE")]
        audit_key_file: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Connects to the PostgreSQL store at `url` to read it only (nothing is
/// migrated or written).
pub(crate) fn connect_read_only(url: &str) -> Result<PgStore, String> {
    PgStore::connect_read_only(url, PgOptions::default()).map_err(|e| e.to_string())
}

/// Connects to the PostgreSQL store at `url`, keyed with `key` when given.
pub(crate) fn connect(url: &str, key: Option<AuditKey>) -> Result<PgStore, String> {
    PgStore::connect_with(
        url,
        PgOptions {
            key,
            ..PgOptions::default()
        },
    )
    .map_err(|e| e.to_string())
}

/// Opens the vessel database of `data_dir`, which must exist, to read it
/// only.
pub(crate) fn open(data_dir: &Path) -> Result<SqliteStore, String> {
    open_file(&data_dir.join(DATABASE_FILE))
}

/// Opens the vessel database at `path`, which must exist, to read it only
/// (nothing is migrated or written, so a store the caller may not write
/// opens too).
pub(crate) fn open_file(path: &Path) -> Result<SqliteStore, String> {
    if !path.exists() {
        return Err(format!("no vessel database at `{}`", path.display()));
    }
    SqliteStore::open_read_only(path).map_err(|e| e.to_string())
}

/// Where the head of `data_dir`'s audit log is kept: `given`, else beside
/// the data directory.
pub(crate) fn head_file(data_dir: &Path, given: Option<&Path>) -> Result<PathBuf, String> {
    match given {
        Some(file) => Ok(file.to_owned()),
        None => audit_head_file(data_dir).ok_or_else(|| {
            format!(
                "the data directory `{}` has no name to keep its audit head beside",
                data_dir.display()
            )
        }),
    }
}

/// The store of `dk vessel`, keeping its audit log's head in
/// `head_file_given` (default beside the data directory) and, given
/// `key_file`, keying the chain with the key kept there (made on first use;
/// refused inside the data directory); and a line for the start text saying
/// where. A log that no longer matches the kept head is refused with what to
/// do.
pub fn open_vessel_store(
    data_dir: &Path,
    head_file_given: Option<&Path>,
    key_file: Option<&Path>,
) -> Result<(SqliteStore, String), String> {
    let head_file = head_file(data_dir, head_file_given)?;
    let key = chain_key(data_dir, key_file)?;
    let said = match (&key, key_file) {
        (Some(key), Some(file)) => format!(
            "head kept in {}; chain keyed with the key in {} (key {})",
            head_file.display(),
            file.display(),
            key.id()
        ),
        _ => format!("head kept in {}; chain not keyed", head_file.display()),
    };
    let audit = AuditOptions {
        head_file: Some(head_file.clone()),
        key,
    };
    let store = SqliteStore::open_with(&data_dir.join(DATABASE_FILE), audit).map_err(|e| {
        match e {
            StoreError::HeadMismatch { .. } => format!(
                "{e}\n  `dk audit verify --data-dir {}` says what changed; to go on with the log as it is, move `{}` away",
                data_dir.display(),
                head_file.display()
            ),
            other => other.to_string(),
        }
    })?;
    Ok((store, said))
}

/// The chain's key from `key_file` when given (made on first use; refused
/// inside the data directory).
fn chain_key(data_dir: &Path, key_file: Option<&Path>) -> Result<Option<AuditKey>, String> {
    let Some(file) = key_file else {
        return Ok(None);
    };
    refuse_inside(data_dir, file)?;
    AuditKey::load_or_create(file)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// The PostgreSQL store at `url` for `dk vessel --store`, its chain keyed
/// with the key in `key_file` when given (made on first use; refused
/// inside the data directory), and a line for the start text.
pub fn open_vessel_pg(
    url: &str,
    data_dir: &Path,
    key_file: Option<&Path>,
) -> Result<(PgStore, String), String> {
    let key = chain_key(data_dir, key_file)?;
    let said = match (&key, key_file) {
        (Some(key), Some(file)) => format!(
            "kept in PostgreSQL; chain keyed with the key in {} (key {})",
            file.display(),
            key.id()
        ),
        _ => "kept in PostgreSQL; chain not keyed".to_owned(),
    };
    let store = connect(url, key)?;
    let said = format!("{said}; store {}", store.server());
    Ok((store, said))
}

/// Refuses a key file inside the data directory, where whoever can rewrite
/// the log could read it.
fn refuse_inside(data_dir: &Path, key_file: &Path) -> Result<(), String> {
    if dk_files::private::is_inside(data_dir, key_file).map_err(|e| e.to_string())? {
        return Err(format!(
            "the audit key file `{}` is inside the data directory `{}`: keep it outside, where rewriting the log does not reach it",
            key_file.display(),
            data_dir.display()
        ));
    }
    Ok(())
}

/// Runs an audit command.
pub fn run(command: AuditCommand) -> ExitCode {
    let result = match command {
        AuditCommand::Tail {
            data_dir,
            store,
            lines,
            follow,
            json,
        } => match store {
            Some(url) => {
                connect_read_only(&url).and_then(|store| tail(&store, lines, follow, json))
            }
            None => data_dir_or_home(data_dir.as_deref())
                .map_err(|e| e.to_string())
                .and_then(|(data_dir, _)| open(&data_dir))
                .and_then(|store| tail(&store, lines, follow, json)),
        },
        AuditCommand::Verify {
            data_dir,
            store,
            audit_head_file,
            expect_head,
            no_kept_head,
            audit_key_file,
            json,
        } => {
            let data_dir = match data_dir_or_home(data_dir.as_deref()) {
                Ok((data_dir, _)) => data_dir,
                Err(e) => {
                    eprintln!("error: {}", printable(&e.to_string()));
                    return ExitCode::FAILURE;
                }
            };
            let key = match audit_key_file.as_deref().map(AuditKey::load) {
                None => None,
                Some(Ok(key)) => audit_key_file.map(|file| (file, key)),
                Some(Err(e)) => {
                    eprintln!("error: {}", printable(&e.to_string()));
                    return ExitCode::FAILURE;
                }
            };
            if let Some(url) = store {
                let kept = match (expect_head, audit_head_file) {
                    (Some(text), _) => match text.parse() {
                        Ok(head) => Kept::Given(head),
                        Err(e) => {
                            eprintln!("error: --expect-head: {e}");
                            return ExitCode::FAILURE;
                        }
                    },
                    (None, Some(file)) if !no_kept_head => match Kept::read(file) {
                        Ok(kept) => kept,
                        Err(e) => {
                            eprintln!("error: {}", printable(&e.to_string()));
                            return ExitCode::FAILURE;
                        }
                    },
                    _ => Kept::NotAsked,
                };
                let report = connect_read_only(&url).and_then(|store| {
                    store
                        .verify_audit_with(key.as_ref().map(|(_, key)| key), kept.head())
                        .map_err(|e| e.to_string())
                });
                return print_verified(report, &kept, key.as_ref(), Whose::Vessel, json);
            }
            let kept = if no_kept_head {
                Kept::NotAsked
            } else if let Some(text) = expect_head {
                match text.parse() {
                    Ok(head) => Kept::Given(head),
                    Err(e) => {
                        eprintln!("error: --expect-head: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                match head_file(&data_dir, audit_head_file.as_deref())
                    .and_then(|file| Kept::read(file).map_err(|e| e.to_string()))
                {
                    Ok(kept) => kept,
                    Err(e) => {
                        eprintln!("error: {}", printable(&e));
                        return ExitCode::FAILURE;
                    }
                }
            };
            return verify(
                &data_dir.join(DATABASE_FILE),
                &kept,
                key.as_ref(),
                Whose::Vessel,
                json,
            );
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", printable(&e));
            ExitCode::FAILURE
        }
    }
}

fn show(entry: &AuditEntry, json: bool) {
    if json {
        println!(
            "{}",
            json!({"seq": entry.seq, "atMs": entry.at_ms, "kind": entry.kind, "entry": entry.entry, "hash": entry.hash})
        );
    } else {
        println!(
            "#{:<6} {} {:<9} {}",
            entry.seq,
            local_time(entry.at_ms),
            entry.kind,
            printable(&entry.entry.to_string())
        );
    }
}

/// When an entry was recorded, readable: the local time (the system's
/// zone, or `TZ`) to the millisecond, with its offset from UTC, such as
/// `2026-12-02 17:04:05.123 +01:00`. The raw milliseconds when they name no
/// time jiff can show.
fn local_time(at_ms: u64) -> String {
    i64::try_from(at_ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map_or_else(
            || at_ms.to_string(),
            |at| {
                at.to_zoned_datetime(jiff::tz::TimeZone::system())
                    .strftime("%Y-%m-%d %H:%M:%S%.3f %:z")
                    .to_string()
            },
        )
}

fn tail(store: &dyn Store, lines: u64, follow: bool, json: bool) -> Result<(), String> {
    let total = store.audit_head().map_err(|e| e.to_string())?.seq;
    let mut after = total.saturating_sub(lines);
    loop {
        let batch = store.read_audit(after, 500).map_err(|e| e.to_string())?;
        for entry in &batch {
            show(entry, json);
            after = entry.seq;
        }
        if batch.len() == 500 {
            continue;
        }
        if !follow {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The head `dk audit verify` checks the log against.
pub(crate) enum Kept {
    /// `--no-kept-head`.
    NotAsked,
    /// `--expect-head`.
    Given(AuditHead),
    /// Read from the head file.
    File(PathBuf, AuditHead),
    /// The head file is not there.
    Missing(PathBuf),
}

impl Kept {
    /// The head kept in `file`. Read before the log, so entries a running
    /// vessel commits meanwhile are never taken for a cut.
    pub(crate) fn read(file: PathBuf) -> Result<Kept, dk_store::StoreError> {
        Ok(match AuditHead::read_from(&file)? {
            Some(head) => Kept::File(file, head),
            None => Kept::Missing(file),
        })
    }

    fn head(&self) -> Option<&AuditHead> {
        match self {
            Kept::Given(head) | Kept::File(_, head) => Some(head),
            Kept::NotAsked | Kept::Missing(_) => None,
        }
    }

    /// What the person is told about the kept head, checking `whose` log.
    fn describe(&self, whose: Whose) -> String {
        match (self, whose) {
            // A copy is checked against the head the vessel had kept when
            // it began, which is not the copy's: only where it stands is
            // told, so that the one head shown is the copy's.
            (Kept::File(file, head), Whose::Backup) => format!(
                "checked against the head the vessel kept before the copy (entry {}, in {})",
                head.seq,
                file.display()
            ),
            (Kept::NotAsked | Kept::Missing(_), Whose::Backup) => {
                "the vessel kept no head beside its data directory: a cut tail or a rewritten chain would go unseen".to_owned()
            }
            (kept, _) => kept.describe_own(),
        }
    }

    /// What the person is told about the kept head of the vessel's own log.
    fn describe_own(&self) -> String {
        match self {
            Kept::NotAsked => {
                "checked without a kept head (--no-kept-head): a cut tail or a rewritten chain would go unseen".to_owned()
            }
            Kept::Given(head) => format!("checked against the head given: {head}"),
            Kept::File(file, head) => {
                format!("checked against the head kept in {}: {head}", file.display())
            }
            Kept::Missing(file) => format!("no head kept in {}", file.display()),
        }
    }
}

/// Whose log a verification reads, which says how its heads are told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Whose {
    /// The vessel's own (`dk audit verify`).
    Vessel,
    /// A backup just taken (`dk backup`), checked against the head the
    /// vessel kept before the copy.
    Backup,
}

/// Verifies the log of the database at `db` and prints what was found (as
/// `dk audit verify` does); success when it is intact.
pub(crate) fn verify(
    db: &Path,
    kept: &Kept,
    key: Option<&(PathBuf, AuditKey)>,
    whose: Whose,
    json: bool,
) -> ExitCode {
    let report = open_file(db).and_then(|store| {
        store
            .verify_audit_with(key.map(|(_, key)| key), kept.head())
            .map_err(|e| e.to_string())
    });
    print_verified(report, kept, key, whose, json)
}

/// Prints what a verification found (as `dk audit verify` does); success
/// when the log is intact.
fn print_verified(
    report: Result<VerifyReport, String>,
    kept: &Kept,
    key: Option<&(PathBuf, AuditKey)>,
    whose: Whose,
    json: bool,
) -> ExitCode {
    let report = match report {
        Ok(report) => report,
        Err(e) => {
            eprintln!("error: {}", printable(&e));
            return ExitCode::FAILURE;
        }
    };
    let mut problems: Vec<String> = report.problems.iter().map(ToString::to_string).collect();
    if let Kept::Missing(file) = kept {
        problems.push(format!(
            "no kept head at `{}`: entries cut off the end, or a chain rewritten with recomputed hashes, would go unseen (give --audit-head-file, --expect-head, or --no-kept-head)",
            file.display()
        ));
    }
    let intact = problems.is_empty();
    let head = format!("{}:{}", report.entries, report.head);
    if json {
        let kept_head = match kept {
            Kept::File(file, head) => {
                json!({"file": file.display().to_string(), "head": head.to_string()})
            }
            Kept::Given(head) => json!({"head": head.to_string()}),
            Kept::Missing(file) => json!({"file": file.display().to_string(), "head": null}),
            Kept::NotAsked => json!(null),
        };
        let key =
            key.map(|(file, key)| json!({"file": file.display().to_string(), "id": key.id()}));
        println!(
            "{}",
            json!({"intact": intact, "entries": report.entries, "head": head, "keptHead": kept_head, "key": key, "problems": problems})
        );
    } else {
        for problem in &problems {
            println!("BROKEN {}", printable(problem));
        }
        println!("{}", printable(&kept.describe(whose)));
        match key {
            Some((file, key)) => println!(
                "{}",
                printable(&format!(
                    "checked with the key in {} (key {})",
                    file.display(),
                    key.id()
                ))
            ),
            None => println!(
                "checked without a key: if the chain was keyed, a rewrite that removed its keying would go unseen"
            ),
        }
        if intact && whose == Whose::Backup {
            println!(
                "the backup's audit log is intact: {} entries; its head is {head} (keep it with the backup: `dk restore --expect-head {head}` checks it)",
                report.entries
            );
        } else if intact {
            println!(
                "intact: {} entries; head {head} (the vessel keeps it outside the database; keep a copy elsewhere too)",
                report.entries
            );
        } else {
            println!(
                "the audit log was tampered with: {} problem(s)",
                problems.len()
            );
        }
    }
    if intact {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
