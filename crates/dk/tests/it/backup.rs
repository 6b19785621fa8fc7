//! `dk backup` of a running vessel while calls are made, and `dk restore`:
//! the copy verifies and holds the entries; a restore brings the devices
//! back; a running vessel's home, a tampered backup, a file that is not a
//! dk store and an existing backup file are each refused.

use std::path::Path;
use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde_json::json;

use crate::durable::{DeviceRun, approve, call, connected, token_in};
use crate::process::{Running, Scratch, audit, audit_entries, eventually, succeeded};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_while_running_and_restore() {
    let scratch = Scratch::new("backup");
    let dir = scratch.data_dir();
    let vessel = Running::start(&scratch);
    let lamp_token = scratch.device_token_file("lamp");
    let lock_token = scratch.device_token_file("lock");
    let lamp = DeviceRun::spawn(dk_device::samples::lamp(), &vessel.url(), &lamp_token);
    approve(&dir, "desk-lamp", "read_light,set_light").await;
    let lock = DeviceRun::spawn(dk_device::samples::lock(), &vessel.url(), &lock_token);
    approve(&dir, "front-door", "read_lock,lock").await;
    connected(&dir, &["desk-lamp", "front-door"]).await;

    // Calls go on while the backup is taken.
    let admin = vessel.admin(&scratch);
    let stop = Arc::new(AtomicBool::new(false));
    let made = Arc::new(AtomicU64::new(0));
    let caller = tokio::spawn({
        let (stop, made) = (Arc::clone(&stop), Arc::clone(&made));
        async move {
            while !stop.load(Ordering::Relaxed) {
                let read = call(&admin, "device__desk_lamp__read_light", json!({})).await;
                assert_eq!(read["ok"], true, "{read}");
                made.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    dk_testkit::eventually("20 calls made", || made.load(Ordering::Relaxed) >= 20).await;
    // The writer commits in batches, later on a loaded machine: the backup
    // is taken once ten decisions are in the log.
    eventually("ten decisions committed", || async {
        let entries = audit_entries(&dir, 10_000);
        (entries.iter().filter(|e| e["kind"] == "decision").count() >= 10).then_some(())
    })
    .await;
    let copy_dir = scratch.root().join("copy");
    std::fs::create_dir_all(&copy_dir).unwrap();
    let copy = copy_dir.join("vessel.db");
    let said = succeeded(&scratch.run(&["backup", path(&copy)]));
    assert!(said.contains("backup of"), "{said}");
    assert!(said.contains("intact:"), "{said}");
    dk_testkit::eventually("40 calls made", || made.load(Ordering::Relaxed) >= 40).await;
    stop.store(true, Ordering::Relaxed);
    caller.await.unwrap();

    // The copy verifies on its own and holds the pairings and the calls.
    succeeded(&audit(&copy_dir, &["verify", "--no-kept-head"]));
    let entries = audit_entries(&copy_dir, 10_000);
    let kinds: Vec<&str> = entries.iter().filter_map(|e| e["kind"].as_str()).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "paired").count(),
        2,
        "{kinds:?}"
    );
    // The ten decisions committed before the backup are in it.
    assert!(
        kinds.iter().filter(|k| **k == "decision").count() >= 10,
        "{kinds:?}"
    );

    // No secret is in the copy: not the admin token, the device tokens or
    // the vessel's key file.
    let bytes = std::fs::read(&copy).unwrap();
    let held = |secret: &[u8]| bytes.windows(secret.len()).any(|w| w == secret);
    for file in [
        scratch.admin_token_file(),
        lamp_token.clone(),
        lock_token.clone(),
        scratch.home().join("vessel.key"),
    ] {
        let secret = std::fs::read(&file).unwrap();
        let secret = secret.trim_ascii();
        assert!(secret.len() >= 32, "{}", file.display());
        assert!(!held(secret), "{} is in the backup", file.display());
    }

    // An existing file is refused without --force, replaced with it.
    let existing = refused(&scratch.run(&["backup", path(&copy)]));
    assert!(
        existing.contains("already exists: give --force"),
        "{existing}"
    );
    succeeded(&scratch.run(&["backup", "--force", path(&copy)]));
    let backup = scratch.root().join("backup.db");
    succeeded(&scratch.run(&["backup", path(&backup)]));

    // After the backup the lock is unpaired; a restore brings it back.
    let kept_lock_token = token_in(&lock_token).await;
    succeeded(&scratch.run(&["devices", "unpair", "front-door"]));
    let running = refused(&scratch.run(&["restore", path(&backup)]));
    assert!(running.contains("a vessel is running on"), "{running}");

    vessel.interrupt();
    let _ = lamp.stop().await;
    let _ = lock.stop().await;

    // A tampered backup and a file that is not a dk store are refused, and
    // leave the database as it was.
    let tampered = scratch.root().join("tampered.db");
    std::fs::copy(&backup, &tampered).unwrap();
    let conn = rusqlite::Connection::open(&tampered).unwrap();
    conn.execute_batch(
        "DROP TRIGGER audit_no_update; DROP TRIGGER audit_no_delete;
         UPDATE audit SET entry = replace(entry, 'read_light', 'set_light')
         WHERE seq = (SELECT max(seq) FROM audit WHERE kind = 'decision');",
    )
    .unwrap();
    drop(conn);
    let said = refused(&scratch.run(&["restore", path(&tampered)]));
    assert!(
        said.contains("does not verify, nothing was restored"),
        "{said}"
    );
    let junk = scratch.root().join("junk.db");
    std::fs::write(&junk, b"not a database, not at all, no pages here........").unwrap();
    let said = refused(&scratch.run(&["restore", path(&junk)]));
    assert!(said.contains("not a dk store"), "{said}");
    let said = refused(&scratch.run(&["restore", path(&scratch.root().join("none.db"))]));
    assert!(said.contains("there is no backup at"), "{said}");

    let said = succeeded(&scratch.run(&["restore", path(&backup)]));
    assert!(said.contains("audit log intact"), "{said}");
    succeeded(&audit(
        &dir,
        &[
            "verify",
            "--audit-head-file",
            path(&scratch.home().join("vessel.audit-head")),
        ],
    ));

    std::fs::write(&lock_token, &kept_lock_token).unwrap();
    let vessel = Running::start(&scratch);
    let lamp = DeviceRun::spawn(dk_device::samples::lamp(), &vessel.url(), &lamp_token);
    let lock = DeviceRun::spawn(dk_device::samples::lock(), &vessel.url(), &lock_token);
    connected(&dir, &["desk-lamp", "front-door"]).await;
    vessel.interrupt();
    let _ = lamp.stop().await;
    let _ = lock.stop().await;
}
