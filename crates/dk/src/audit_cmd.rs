//! `dk audit tail` and `dk audit verify`: read a vessel's audit log straight
//! from its database (a running vessel keeps writing; reading is safe).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use dk_vessel::{AuditEntry, AuditHead, SqliteStore, Store};
use serde_json::json;

use crate::home::{DATABASE_FILE, data_dir_or_home};
use crate::input::printable;

/// Audit commands.
#[derive(Subcommand)]
pub enum AuditCommand {
    /// Print the last entries, oldest first; `--follow` keeps printing new ones.
    Tail {
        /// The vessel's data directory. [default: `vessel` in dk's home]
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// How many of the last entries to print first.
        #[arg(long, short = 'n', default_value_t = 20)]
        lines: u64,
        /// Keep printing entries as they are committed (Ctrl-C stops).
        #[arg(long)]
        follow: bool,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Check the hash chain; exit 0 when intact, 1 saying where it breaks.
    Verify {
        /// The vessel's data directory. [default: `vessel` in dk's home]
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// A head kept from an earlier verify (`SEQ:HASH`): also detects
        /// entries cut off the end since then.
        #[arg(long)]
        expect_head: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

fn open(data_dir: Option<&std::path::Path>) -> Result<SqliteStore, String> {
    let (data_dir, _) = data_dir_or_home(data_dir).map_err(|e| e.to_string())?;
    let path = data_dir.join(DATABASE_FILE);
    if !path.exists() {
        return Err(format!("no vessel database at `{}`", path.display()));
    }
    SqliteStore::open(&path).map_err(|e| e.to_string())
}

/// Runs an audit command.
pub fn run(command: AuditCommand) -> ExitCode {
    let result = match command {
        AuditCommand::Tail {
            data_dir,
            lines,
            follow,
            json,
        } => tail(data_dir.as_deref(), lines, follow, json),
        AuditCommand::Verify {
            data_dir,
            expect_head,
            json,
        } => return verify(data_dir.as_deref(), expect_head.as_deref(), json),
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
            entry.at_ms,
            entry.kind,
            printable(&entry.entry.to_string())
        );
    }
}

fn tail(
    data_dir: Option<&std::path::Path>,
    lines: u64,
    follow: bool,
    json: bool,
) -> Result<(), String> {
    let store = open(data_dir)?;
    let total = store.verify_audit().map_err(|e| e.to_string())?.entries;
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

fn verify(data_dir: Option<&std::path::Path>, expect_head: Option<&str>, json: bool) -> ExitCode {
    let expected = match expect_head.map(parse_head) {
        None => None,
        Some(Ok(head)) => Some(head),
        Some(Err(e)) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let report = open(data_dir).and_then(|store| {
        match &expected {
            Some(head) => store.verify_audit_against(head),
            None => store.verify_audit(),
        }
        .map_err(|e| e.to_string())
    });
    let report = match report {
        Ok(report) => report,
        Err(e) => {
            eprintln!("error: {}", printable(&e));
            return ExitCode::FAILURE;
        }
    };
    let intact = report.problems.is_empty();
    if json {
        let problems: Vec<String> = report.problems.iter().map(ToString::to_string).collect();
        println!(
            "{}",
            json!({"intact": intact, "entries": report.entries, "head": format!("{}:{}", report.entries, report.head), "problems": problems})
        );
    } else {
        for problem in &report.problems {
            println!("BROKEN {}", printable(&problem.to_string()));
        }
        if intact {
            println!(
                "intact: {} entries; head {}:{} (keep it to detect later truncation)",
                report.entries, report.entries, report.head
            );
        } else {
            println!(
                "the audit log was tampered with: {} problem(s)",
                report.problems.len()
            );
        }
    }
    if intact {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn parse_head(text: &str) -> Result<AuditHead, String> {
    let (seq, hash) = text.split_once(':').ok_or("--expect-head is SEQ:HASH")?;
    let seq = seq
        .parse()
        .map_err(|_| "--expect-head: SEQ must be a number")?;
    Ok(AuditHead {
        seq,
        hash: hash.to_owned(),
    })
}
