//! What `dk backup` and `dk restore` tell the person: one head, the copy's,
//! after a backup; FILE, never the hidden file the copy is first written
//! to; a backup file that is not there said so, not taken for a corrupt
//! store; and the problems of a backup that does not verify each on a line
//! of its own.

use std::path::Path;
use std::process::Output;

use serde_json::Value;

use crate::process::{Running, Scratch, audit, succeeded};

fn refused(out: &Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The audit heads (`SEQ:HASH`) `text` shows.
fn heads(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_ascii_hexdigit() || c == ':'))
        .filter(|word| {
            word.split_once(':').is_some_and(|(seq, hash)| {
                !seq.is_empty()
                    && seq.bytes().all(|b| b.is_ascii_digit())
                    && hash.len() == 64
                    && hash.bytes().all(|b| b.is_ascii_hexdigit())
            })
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn backup_and_restore_say_what_they_did_plainly() {
    let scratch = Scratch::new("backup-words");
    let vessel = Running::start(&scratch);

    // One head is shown, and it is the copy's.
    let copy_dir = scratch.root().join("copy");
    std::fs::create_dir_all(&copy_dir).unwrap();
    let copy = copy_dir.join("vessel.db");
    let said = succeeded(&scratch.run(&["backup", path(&copy)]));
    let verified: Value = serde_json::from_str(&succeeded(&audit(
        &copy_dir,
        &["verify", "--no-kept-head", "--json"],
    )))
    .unwrap();
    let copy_head = verified["head"].as_str().unwrap();
    // The head the vessel kept before the copy is where the check began,
    // not the copy's: it is told without its hash.
    let kept = said.lines().find(|l| l.contains("kept")).unwrap();
    assert!(heads(kept).is_empty(), "{said}");
    assert!(!heads(&said).is_empty(), "{said}");
    assert!(heads(&said).iter().all(|h| h == copy_head), "{said}");
    assert!(
        said.contains(&format!("dk restore --expect-head {copy_head}")),
        "{said}"
    );

    // A backup that cannot be written names FILE.
    let nowhere = scratch.root().join("no-such-dir").join("backup.db");
    let said = refused(&scratch.run(&["backup", path(&nowhere)]));
    assert!(
        said.contains(&format!("cannot write the backup to `{}`", path(&nowhere))),
        "{said}"
    );
    assert!(!said.contains(".tmp"), "{said}");
    vessel.interrupt();

    // A backup file that is not there, or not a file.
    let missing = scratch.root().join("none.db");
    let said = refused(&scratch.run(&["restore", path(&missing)]));
    assert_eq!(
        said,
        format!("error: there is no backup at `{}`\n", path(&missing))
    );
    let said = refused(&scratch.run(&["restore", path(&copy_dir)]));
    assert!(said.contains("is not a file"), "{said}");
    assert!(!said.contains("corrupt"), "{said}");

    // A backup whose log does not verify: each problem on its own line.
    let tampered = scratch.root().join("tampered.db");
    std::fs::copy(&copy, &tampered).unwrap();
    let conn = rusqlite::Connection::open(&tampered).unwrap();
    conn.execute_batch(
        "DROP TRIGGER audit_no_update;
         UPDATE audit SET entry = replace(entry, '}', ',\"x\":1}')
         WHERE seq = (SELECT max(seq) FROM audit);",
    )
    .unwrap();
    drop(conn);
    let said = refused(&scratch.run(&["restore", path(&tampered)]));
    assert!(!said.contains("\\u{"), "{said}");
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(
        lines.first().copied(),
        Some(
            format!(
                "error: the audit log of `{}` does not verify, nothing was restored:",
                path(&tampered)
            )
            .as_str()
        ),
        "{said}"
    );
    assert!(lines.len() >= 2, "{said}");
    assert!(
        lines.iter().skip(1).all(|line| line.starts_with("  ")),
        "{said}"
    );
}
