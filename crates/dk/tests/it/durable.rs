//! A `dk vessel` restarted on its data directory: devices come back with
//! their tokens and exactly their grants, unpaired ones stay out; no token in
//! clear in any file of the data directory; `dk audit tail` and `dk audit
//! verify` on a real log and on tampered copies: what the chain, the state
//! tables, the head kept beside the data directory and a keyed chain each
//! find, and a vessel that will not start on a log that no longer matches.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dk_device::{ClientError, ClientOptions, Device, run_client};
use dk_http::AdminClient;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::person;
use crate::process::{
    PATIENCE, Running, Scratch, audit, audit_entries, devices, eventually, succeeded,
};

/// A device client running until stopped.
pub(crate) struct DeviceRun {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), ClientError>>,
    /// Pairing codes the client showed: one per pairing it asked for.
    codes: Arc<Mutex<Vec<String>>>,
}

impl DeviceRun {
    pub(crate) fn spawn(device: Device, url: &str, token_file: &Path) -> DeviceRun {
        let codes = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&codes);
        let options = ClientOptions::new(url)
            .v1()
            .token_file(token_file)
            .on_code(move |code| seen.lock().unwrap().push(code.to_owned()))
            .backoff(Duration::from_millis(20), Duration::from_millis(100));
        let (stop, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            run_client(&device, options, async move {
                let _ = stop_rx.await;
            })
            .await
        });
        DeviceRun {
            stop: Some(stop),
            task,
            codes,
        }
    }

    pub(crate) async fn stop(mut self) -> Result<(), ClientError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .unwrap()
            .unwrap()
    }

    async fn ended(self) -> Result<(), ClientError> {
        let DeviceRun { stop, task, .. } = self;
        let result = tokio::time::timeout(PATIENCE, task).await.unwrap().unwrap();
        drop(stop);
        result
    }

    fn codes_shown(&self) -> usize {
        self.codes.lock().unwrap().len()
    }

    /// The pairing codes the client showed.
    pub(crate) fn codes(&self) -> Vec<String> {
        self.codes.lock().unwrap().clone()
    }
}

/// Approves the pending pairing of `device` with `dk pairings approve`.
pub(crate) async fn approve(dir: &Path, device: &str, grant: &str) {
    let id = eventually(&format!("the pairing request of {device}"), || async {
        let out = person(dir, &["pairings", "--json"]);
        let list: Value = serde_json::from_str(&succeeded(&out)).unwrap();
        list.as_array()?
            .iter()
            .find(|p| p["request"]["deviceId"] == device)
            .map(|p| p["id"].to_string())
    })
    .await;
    succeeded(&person(
        dir,
        &["pairings", "approve", &id, "--grant", grant],
    ));
}

/// `dk devices --json` once every device in `ids` is connected.
pub(crate) async fn connected(dir: &Path, ids: &[&str]) -> Value {
    eventually(&format!("{ids:?} connected"), || async {
        let list: Value =
            serde_json::from_str(&succeeded(&person(dir, &["devices", "--json"]))).unwrap();
        let all = ids.iter().all(|id| {
            list.as_array()
                .unwrap()
                .iter()
                .any(|d| d["id"] == *id && d["connected"] == true)
        });
        all.then_some(list)
    })
    .await
}

/// `dk devices --json` as (id, grants) pairs.
fn grants_of(list: &Value) -> Vec<(String, Value)> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|d| (d["id"].as_str().unwrap().to_owned(), d["grants"].clone()))
        .collect()
}

pub(crate) async fn call(admin: &AdminClient, tool: &str, input: Value) -> Value {
    let answer = admin
        .post("/v1/tools/call", &json!({"tool": tool, "input": input}))
        .await
        .unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.body
}

#[derive(Clone, Copy, Debug)]
enum Stop {
    Kill,
    Interrupt,
}

async fn restart_keeps_devices_and_grants(stop: Stop) {
    let scratch = Scratch::new(&format!("restart-{stop:?}"));
    let dir = scratch.data_dir();
    let (lamp_token, lock_token) = (
        scratch.device_token_file("lamp"),
        scratch.device_token_file("lock"),
    );
    let vessel = Running::start(&scratch);
    let lamp = DeviceRun::spawn(dk_device::samples::lamp(), &vessel.url(), &lamp_token);
    approve(&dir, "desk-lamp", "read_light,set_light").await;
    let lock = DeviceRun::spawn(dk_device::samples::lock(), &vessel.url(), &lock_token);
    approve(&dir, "front-door", "read_lock,lock").await;
    connected(&dir, &["desk-lamp", "front-door"]).await;

    for change in [
        ["devices", "grant", "desk-lamp", "strobe"],
        ["devices", "revoke", "desk-lamp", "set_light"],
        ["devices", "revoke", "front-door", "lock"],
        ["devices", "grant", "front-door", "unlock"],
    ] {
        succeeded(&person(&dir, &change));
    }
    // The lock's token, kept to show it no longer works once unpaired.
    let old_lock_token = token_in(&lock_token).await;
    succeeded(&person(&dir, &["devices", "unpair", "front-door"]));
    assert!(matches!(lock.ended().await, Err(ClientError::Unpaired)));
    let admin = vessel.admin(&scratch);
    let read = call(&admin, "device__desk_lamp__read_light", json!({})).await;
    assert_eq!(read["ok"], true, "{read}");
    let before = grants_of(&connected(&dir, &["desk-lamp"]).await);
    assert_eq!(
        before,
        [("desk-lamp".to_owned(), json!(["read_light", "strobe"]))]
    );

    match stop {
        Stop::Kill => vessel.kill(),
        Stop::Interrupt => vessel.interrupt(),
    }
    let _ = lamp.stop().await;

    // A new vessel on the same data directory, on new ports.
    let vessel = Running::start(&scratch);
    let lamp = DeviceRun::spawn(dk_device::samples::lamp(), &vessel.url(), &lamp_token);
    let after = connected(&dir, &["desk-lamp"]).await;
    assert_eq!(grants_of(&after), before, "{after}");
    assert_eq!(lamp.codes_shown(), 0, "the lamp asked to pair again");
    let admin = vessel.admin(&scratch);
    let pending = admin.get("/v1/pending").await.unwrap();
    assert_eq!(pending.body, json!([]));

    // The unpaired lock's token is refused, and nothing comes back.
    std::fs::create_dir_all(lock_token.parent().unwrap()).unwrap();
    std::fs::write(&lock_token, &old_lock_token).unwrap();
    let lock = DeviceRun::spawn(dk_device::samples::lock(), &vessel.url(), &lock_token);
    let ended = lock.ended().await;
    assert!(matches!(ended, Err(ClientError::AuthFailed)), "{ended:?}");
    assert_eq!(grants_of(&Value::Array(devices(&admin).await)), before);

    // Calls work, within the grants that survived.
    let read = call(&admin, "device__desk_lamp__read_light", json!({})).await;
    assert_eq!(read["ok"], true, "{read}");
    let set = call(&admin, "device__desk_lamp__set_light", json!({"on": true})).await;
    assert_eq!(set["ok"], false, "{set}");
    assert_eq!(
        audit(&dir, &["verify"]).status.code(),
        Some(0),
        "the audit log is intact across the restart"
    );
    lamp.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vessel_killed_and_restarted_serves_its_devices_with_their_grants() {
    restart_keeps_devices_and_grants(Stop::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vessel_stopped_and_restarted_serves_its_devices_with_their_grants() {
    restart_keeps_devices_and_grants(Stop::Interrupt).await;
}

/// A notepad: one actuator taking a string.
pub(crate) fn notepad() -> Device {
    let manifest = json!({
        "id": "notepad",
        "name": "Notepad",
        "kind": "notepad",
        "version": "1.0.0",
        "capabilities": [{
            "name": "write_note",
            "kind": "actuator",
            "description": "Write a note.",
            "params": {"text": {"type": "string", "required": true}},
        }],
    });
    Device::define(&manifest)
        .handler("write_note", |_input| async {
            Ok(json!({"written": true}))
        })
        .build()
        .unwrap()
}

/// The device token a client keeps in `path`, once it has written it.
pub(crate) async fn token_in(path: &Path) -> String {
    eventually("the token file", || async {
        let text = std::fs::read_to_string(path).ok()?;
        let token = text.trim().to_owned();
        (token.len() == 64).then_some(token)
    })
    .await
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
        }
    }
    out
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

/// Every form of each secret that must not be on disk: the text, the hex of
/// its bytes, its base64, and (for a hex token) the bytes it stands for.
pub(crate) fn forms(secret: &str) -> Vec<(String, Vec<u8>)> {
    let bytes = secret.as_bytes();
    let mut forms = vec![
        ("clear".into(), bytes.to_vec()),
        ("upper case".into(), secret.to_uppercase().into_bytes()),
        ("hex of its bytes".into(), hex(bytes).into_bytes()),
        ("base64".into(), base64(bytes).into_bytes()),
    ];
    if secret.len().is_multiple_of(2) && secret.bytes().all(|b| b.is_ascii_hexdigit()) {
        forms.push(("its bytes as binary".into(), unhex(secret)));
    }
    forms
}

/// Reads every file under `dir` and fails naming the file and the form of
/// any secret found in it.
fn scan(dir: &Path, secrets: &[(&str, &str)]) -> usize {
    let mut files = 0;
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let Ok(content) = std::fs::read(&path) else {
                // The vessel may remove a file (the `-wal`) as it is listed.
                continue;
            };
            files += 1;
            for (name, secret) in secrets {
                for (form, bytes) in forms(secret) {
                    assert!(
                        !content.windows(bytes.len()).any(|w| w == bytes.as_slice()),
                        "{name} ({form}) found in {}",
                        path.display()
                    );
                }
            }
        }
    }
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_in_clear_anywhere_in_the_data_directory() {
    let scratch = Scratch::new("secrets");
    let dir = scratch.data_dir();
    let (pad_token, lamp_token) = (
        scratch.device_token_file("notepad"),
        scratch.device_token_file("lamp"),
    );
    let vessel = Running::start(&scratch);
    let pad = DeviceRun::spawn(notepad(), &vessel.url(), &pad_token);
    approve(&dir, "notepad", "write_note").await;
    let lamp = DeviceRun::spawn(dk_device::samples::lamp(), &vessel.url(), &lamp_token);
    approve(&dir, "desk-lamp", "read_light").await;
    connected(&dir, &["notepad", "desk-lamp"]).await;
    let admin = vessel.admin(&scratch);
    let admin_secret = scratch.admin_token().expose().to_owned();
    let pad_secret = token_in(&pad_token).await;
    let lamp_secret = token_in(&lamp_token).await;
    // The vessel's dk/2 secret key, kept beside the admin token.
    let vessel_key = std::fs::read_to_string(scratch.home().join("vessel.key")).unwrap();
    let vessel_key = vessel_key.trim_end();

    // Calls whose inputs hold the tokens, alone and inside longer text.
    let inputs = vec![
        admin_secret.clone(),
        pad_secret.clone(),
        lamp_secret.clone(),
        format!("the admin token is {admin_secret}, keep it"),
        format!("device token: {pad_secret}."),
        format!("{lamp_secret} {pad_secret}"),
        // A token glued to more hex digits (a key and a nonce concatenated).
        format!("{pad_secret}00ff"),
        format!("beef{lamp_secret}{pad_secret}"),
    ];
    for text in &inputs {
        let outcome = call(&admin, "device__notepad__write_note", json!({"text": text})).await;
        assert_eq!(outcome["ok"], true, "{outcome}");
    }
    // Not granted: refused, and recorded too.
    call(
        &admin,
        "device__desk_lamp__set_light",
        json!({"on": true, "note": lamp_secret}),
    )
    .await;
    let secrets = [
        ("the admin token", admin_secret.as_str()),
        ("the notepad's token", pad_secret.as_str()),
        ("the lamp's token", lamp_secret.as_str()),
        ("the vessel's secret key", vessel_key),
    ];
    // The decisions reach the log (write-behind), then the files are read
    // while the vessel runs (`-wal` and `-shm` present) ...
    eventually("the decisions in the audit log", || async {
        let decisions = audit_entries(&dir, 1000)
            .iter()
            .filter(|e| e["kind"] == "decision")
            .count();
        (decisions > inputs.len()).then_some(())
    })
    .await;
    assert!(scan(&dir, &secrets) >= 2);

    // ... after a kill and a restart with the devices back ...
    vessel.kill();
    let _ = pad.stop().await;
    let _ = lamp.stop().await;
    let vessel = Running::start(&scratch);
    let pad = DeviceRun::spawn(notepad(), &vessel.url(), &pad_token);
    connected(&dir, &["notepad"]).await;
    let admin = vessel.admin(&scratch);
    let outcome = call(
        &admin,
        "device__notepad__write_note",
        json!({"text": format!("again {pad_secret} and {admin_secret}")}),
    )
    .await;
    assert_eq!(outcome["ok"], true, "{outcome}");
    scan(&dir, &secrets);

    // ... and after a clean stop.
    vessel.interrupt();
    let _ = pad.stop().await;
    let logged = audit_entries(&dir, 1000);
    let decisions = logged.iter().filter(|e| e["kind"] == "decision").count();
    assert_eq!(decisions, inputs.len() + 2, "{logged:?}");
    scan(&dir, &secrets);
}

/// The canonical text and hash of an entry, as the chain computes them.
fn entry_hash(prev_hash: &str, seq: i64, at_ms: i64, kind: &str, entry: &str) -> String {
    let text = format!("{prev_hash}\n{seq}\n{at_ms}\n{kind}\n{entry}");
    hex(&Sha256::digest(text.as_bytes()))
}

/// A copy of the data directory's database files and of the head kept
/// beside it, with the audit log's triggers dropped as an attacker would,
/// open for tampering.
fn tampered_copy(scratch: &Scratch, name: &str, tamper: impl FnOnce(&rusqlite::Connection)) {
    let copy = scratch.root().join(name);
    std::fs::create_dir_all(&copy).unwrap();
    for entry in std::fs::read_dir(scratch.data_dir()).unwrap() {
        let path = entry.unwrap().path();
        // The database and its `-wal` and `-shm`, not the sockets.
        if path.to_string_lossy().contains("vessel.db") {
            std::fs::copy(&path, copy.join(path.file_name().unwrap())).unwrap();
        }
    }
    std::fs::copy(
        scratch.data_dir().with_extension("audit-head"),
        scratch.root().join(format!("{name}.audit-head")),
    )
    .unwrap();
    let conn = rusqlite::Connection::open(copy.join("vessel.db")).unwrap();
    conn.execute_batch("DROP TRIGGER audit_no_update; DROP TRIGGER audit_no_delete;")
        .unwrap();
    tamper(&conn);
}

#[track_caller]
fn check_broken(dir: &Path, extra: &[&str], expected: &str) {
    let mut args = vec!["verify"];
    args.extend_from_slice(extra);
    let out = audit(dir, &args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {text}");
    assert!(text.contains(expected), "expected {expected:?} in:\n{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_tail_follows_and_verify_finds_every_kind_of_tampering() {
    let scratch = Scratch::new("audit");
    let dir = scratch.data_dir();
    let vessel = Running::start(&scratch);
    let lamp = DeviceRun::spawn(
        dk_device::samples::lamp(),
        &vessel.url(),
        &scratch.device_token_file("lamp"),
    );
    approve(&dir, "desk-lamp", "read_light,set_light").await;
    connected(&dir, &["desk-lamp"]).await;
    succeeded(&person(&dir, &["devices", "grant", "desk-lamp", "strobe"]));
    succeeded(&person(
        &dir,
        &["devices", "revoke", "desk-lamp", "set_light"],
    ));
    let admin = vessel.admin(&scratch);
    call(&admin, "device__desk_lamp__read_light", json!({})).await;
    eventually("the decision in the log", || async {
        (audit_entries(&dir, 100).len() == 6).then_some(())
    })
    .await;

    // `--follow` prints an entry committed while it runs.
    let mut follow = crate::process::Killed(
        std::process::Command::new(env!("CARGO_BIN_EXE_dk"))
            .args([
                "audit",
                "tail",
                "--follow",
                "--json",
                "-n",
                "1",
                "--data-dir",
            ])
            .arg(&dir)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (lines_tx, lines_rx) = std::sync::mpsc::channel::<String>();
    let stdout = follow.0.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines() {
            if lines_tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let first: Value = serde_json::from_str(&lines_rx.recv_timeout(PATIENCE).unwrap()).unwrap();
    assert_eq!(first["kind"], "decision");
    succeeded(&person(&dir, &["devices", "unpair", "desk-lamp"]));
    let next: Value = serde_json::from_str(&lines_rx.recv_timeout(PATIENCE).unwrap()).unwrap();
    drop(follow);
    reader.join().unwrap();
    assert_eq!(
        (next["seq"].as_u64(), next["kind"].as_str()),
        (Some(7), Some("unpaired")),
        "{next}"
    );
    assert!(matches!(lamp.ended().await, Err(ClientError::Unpaired)));

    let entries = audit_entries(&dir, 100);
    let seen: Vec<(u64, &str)> = entries
        .iter()
        .map(|e| (e["seq"].as_u64().unwrap(), e["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(
        seen,
        [
            (1, "vessel-key"),
            (2, "vessel-started"),
            (3, "paired"),
            (4, "granted"),
            (5, "revoked"),
            (6, "decision"),
            (7, "unpaired")
        ]
    );
    assert_eq!(
        entries[2]["entry"]["grants"],
        json!(["read_light", "set_light"])
    );
    assert_eq!(
        (
            &entries[3]["entry"]["capability"],
            &entries[4]["entry"]["capability"]
        ),
        (&json!("strobe"), &json!("set_light"))
    );
    assert_eq!(
        entries[5]["entry"]["tool"],
        json!("device__desk_lamp__read_light")
    );
    vessel.interrupt();
    // A clean stop is the last entry.
    let entries = audit_entries(&dir, 100);
    assert_eq!(entries.len(), 8, "{entries:?}");
    assert_eq!(entries[7]["kind"], "vessel-stopped");

    let out = audit(&dir, &["verify"]);
    let text = succeeded(&out);
    let head = format!("8:{}", entries[7]["hash"].as_str().unwrap());
    assert!(
        text.contains(&format!("intact: 8 entries; head {head}")),
        "{text}"
    );
    // The vessel kept that head beside its data directory, and verify read it.
    let kept = scratch.data_dir().with_extension("audit-head");
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), format!("{head}\n"));
    assert!(
        text.contains(&format!(
            "checked against the head kept in {}: {head}",
            kept.display()
        )),
        "{text}"
    );
    succeeded(&audit(&dir, &["verify", "--expect-head", &head]));

    let edit = "UPDATE audit SET entry = replace(entry, 'strobe', 'set_light') WHERE seq = 4";
    tampered_copy(&scratch, "edited", |db| {
        db.execute_batch(edit).unwrap();
    });
    check_broken(&scratch.root().join("edited"), &[], "entry 4: edited");

    tampered_copy(&scratch, "deleted", |db| {
        db.execute_batch("DELETE FROM audit WHERE seq = 5").unwrap();
    });
    check_broken(&scratch.root().join("deleted"), &[], "entry 5: missing");

    // An entry put in after entry 4, chained to it with a correct hash, the
    // later entries renumbered: only the link after it gives it away.
    tampered_copy(&scratch, "inserted", |db| {
        let prev: String = db
            .query_row("SELECT hash FROM audit WHERE seq = 4", [], |r| r.get(0))
            .unwrap();
        let at: i64 = db
            .query_row("SELECT at_ms FROM audit WHERE seq = 4", [], |r| r.get(0))
            .unwrap();
        db.execute_batch(
            "UPDATE audit SET seq = seq + 1000 WHERE seq > 4;
             UPDATE audit SET seq = seq - 999 WHERE seq > 1000;",
        )
        .unwrap();
        let entry = r#"{"capability":"set_light","deviceId":"desk-lamp"}"#;
        let hash = entry_hash(&prev, 5, at, "granted", entry);
        // Its columns as its text says, so only the chain can tell.
        db.execute(
            "INSERT INTO audit (seq, at_ms, kind, entry, prev_hash, hash, device_id)
             VALUES (5, ?1, 'granted', ?2, ?3, ?4, 'desk-lamp')",
            rusqlite::params![at, entry, prev, hash],
        )
        .unwrap();
    });
    check_broken(&scratch.root().join("inserted"), &[], "entry 5: inserted");

    tampered_copy(&scratch, "reordered", |db| {
        db.execute_batch(
            "UPDATE audit SET seq = 1002 WHERE seq = 4;
             UPDATE audit SET seq = 4 WHERE seq = 5;
             UPDATE audit SET seq = 5 WHERE seq = 1002;",
        )
        .unwrap();
    });
    check_broken(
        &scratch.root().join("reordered"),
        &[],
        "entry 4: out of order",
    );

    // Cutting the last entries leaves an intact chain; the unpairing they
    // held is then missing from the log, and the kept head shows the cut.
    tampered_copy(&scratch, "truncated", |db| {
        db.execute_batch("DELETE FROM audit WHERE seq >= 7")
            .unwrap();
    });
    let truncated = scratch.root().join("truncated");
    check_broken(
        &truncated,
        &[],
        "BROKEN state: the log has `desk-lamp` paired (entry 3), the state does not",
    );
    check_broken(&truncated, &[], "BROKEN entry 7: cut off the end");
    check_broken(
        &truncated,
        &["--expect-head", &head],
        "entry 7: cut off the end",
    );
}

/// A vessel on `scratch` whose log holds: the lamp paired with read_light,
/// strobe granted, then `calls` calls of read_light; stopped cleanly.
async fn logged_lamp(scratch: &Scratch, calls: usize) {
    let dir = scratch.data_dir();
    let vessel = Running::start(scratch);
    let lamp = DeviceRun::spawn(
        dk_device::samples::lamp(),
        &vessel.url(),
        &scratch.device_token_file("lamp"),
    );
    approve(&dir, "desk-lamp", "read_light").await;
    connected(&dir, &["desk-lamp"]).await;
    succeeded(&person(&dir, &["devices", "grant", "desk-lamp", "strobe"]));
    let admin = vessel.admin(scratch);
    for _ in 0..calls {
        call(&admin, "device__desk_lamp__read_light", json!({})).await;
    }
    vessel.interrupt();
    let _ = lamp.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_finds_a_log_emptied_or_cut_back_while_pairings_stand() {
    let scratch = Scratch::new("audit-state");
    let dir = scratch.data_dir();
    logged_lamp(&scratch, 1).await;
    succeeded(&audit(&dir, &["verify"]));

    // `DELETE FROM audit` leaves an empty chain, intact by itself.
    tampered_copy(&scratch, "emptied", |db| {
        db.execute_batch("DELETE FROM audit").unwrap();
    });
    check_broken(
        &scratch.root().join("emptied"),
        &[],
        "BROKEN state: pairing `desk-lamp` (generation 1) has no `paired` entry in the log",
    );
    // Cut back past the grant: the chain is intact, the grant unaccounted.
    tampered_copy(&scratch, "cut", |db| {
        db.execute_batch("DELETE FROM audit WHERE seq >= 4")
            .unwrap();
    });
    check_broken(
        &scratch.root().join("cut"),
        &[],
        "BROKEN state: grant `strobe` on `desk-lamp` has no entry in the log",
    );
}

/// Runs `dk audit verify` with `args` on `dir` and checks whether it finds
/// the log intact; the output, to say why.
#[track_caller]
fn verify_says(dir: &Path, args: &[&str], intact: bool) -> String {
    let mut all = vec!["verify"];
    all.extend_from_slice(args);
    let out = audit(dir, &all);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let expected = if intact { 0 } else { 1 };
    assert_eq!(
        out.status.code(),
        Some(expected),
        "{all:?} on {}:\n{text}",
        dir.display()
    );
    text
}

/// Rewrites every entry's hash and the next one's prev_hash over what is
/// stored, with the documented formula: the chain verifies again.
fn rehash_everything(db: &rusqlite::Connection) {
    let rows: Vec<(i64, i64, String, String)> = db
        .prepare("SELECT seq, at_ms, kind, entry FROM audit ORDER BY seq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut prev = "0".repeat(64);
    for (seq, at, kind, entry) in rows {
        let hash = entry_hash(&prev, seq, at, &kind, &entry);
        db.execute(
            "UPDATE audit SET prev_hash = ?1, hash = ?2 WHERE seq = ?3",
            rusqlite::params![prev, hash, seq],
        )
        .unwrap();
        prev = hash;
    }
}

/// Appends a decision that never happened, chained to the last entry with
/// a correct hash.
fn append_forged(db: &rusqlite::Connection) {
    let (seq, at, prev): (i64, i64, String) = db
        .query_row(
            "SELECT seq, at_ms, hash FROM audit ORDER BY seq DESC LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    let entry = r#"{"allowed":false,"reason":"forged","tool":"device__desk_lamp__strobe"}"#;
    let hash = entry_hash(&prev, seq + 1, at, "decision", entry);
    // A careful forger also fills the columns the log's pages are read by
    // as the entry says (no device, no agent, refused), or verify would
    // find the row by them alone.
    db.execute(
        "INSERT INTO audit (seq, at_ms, kind, entry, prev_hash, hash, allowed)
         VALUES (?1, ?2, 'decision', ?3, ?4, ?5, 0)",
        rusqlite::params![seq + 1, at, entry, prev, hash],
    )
    .unwrap();
}

type Attack = fn(&rusqlite::Connection);

/// Each attack on a real log, and whether verify finds it with the chain
/// and state alone (`--no-kept-head`) and with the head kept beside the
/// data directory (the default).
const ATTACKS: [(&str, Attack, bool, bool); 6] = [
    ("untouched", |_| {}, true, true),
    (
        "delete-all",
        |db| {
            db.execute_batch("DELETE FROM audit").unwrap();
        },
        false,
        false,
    ),
    (
        "delete-some",
        |db| {
            db.execute_batch("DELETE FROM audit WHERE seq = 4").unwrap();
        },
        false,
        false,
    ),
    (
        "rehash-all",
        |db| {
            db.execute_batch(
                "UPDATE audit SET entry = replace(entry, 'read_light', 'strobe') WHERE kind = 'decision'",
            )
            .unwrap();
            rehash_everything(db);
        },
        true,
        false,
    ),
    (
        "cut-tail",
        |db| {
            db.execute_batch("DELETE FROM audit WHERE seq > 4").unwrap();
        },
        true,
        false,
    ),
    ("append-forged", append_forged, true, true),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_verify_finds_without_and_with_the_kept_head() {
    let scratch = Scratch::new("audit-modes");
    let dir = scratch.data_dir();
    logged_lamp(&scratch, 3).await;
    // 1 the vessel's key, 2 its start, 3 paired, 4 granted, 5 to 7
    // decisions, 8 its stop.
    assert_eq!(audit_entries(&dir, 100).len(), 8);
    for (name, attack, chain_alone, with_head) in ATTACKS {
        tampered_copy(&scratch, name, attack);
        let copy = scratch.root().join(name);
        let text = verify_says(&copy, &["--no-kept-head"], chain_alone);
        assert!(text.contains("checked without a kept head"), "{text}");
        verify_says(&copy, &[], with_head);
    }
    // The head file gone: verify says it cannot tell, unless asked not to.
    std::fs::remove_file(scratch.root().join("untouched.audit-head")).unwrap();
    let untouched = scratch.root().join("untouched");
    let text = verify_says(&untouched, &[], false);
    assert!(text.contains("BROKEN no kept head at "), "{text}");
    verify_says(&untouched, &["--no-kept-head"], true);
    // A vessel does not start on a log that no longer matches its head.
    let cut = scratch.root().join("cut-tail");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dk"))
        .args(["vessel", "--no-prompt", "--listen", "127.0.0.1:0"])
        .args([
            "--admin-listen",
            "127.0.0.1:0",
            "--mcp-listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(&cut)
        .arg("--admin-token-file")
        .arg(scratch.admin_token_file())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let error = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{error}");
    assert!(
        error.contains("the audit log does not match the head kept in")
            && error.contains("the log ends at entry 4, the kept head is entry 8"),
        "{error}"
    );
}

/// Starts `dk vessel` on `scratch`'s home with `extra` arguments, and
/// waits for its address file.
fn start_with(scratch: &Scratch, extra: &[&std::ffi::OsStr]) -> Running {
    let mut args = vec!["--mcp-listen", "127.0.0.1:0"];
    args.extend(extra.iter().map(|arg| arg.to_str().unwrap()));
    Running::start_with(scratch, &args)
}

/// `dk vessel` on `dir` with `extra` arguments, expected to refuse to
/// start: its error output.
fn refused_start(scratch: &Scratch, dir: &Path, extra: &[&std::ffi::OsStr]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dk"))
        .args(["vessel", "--no-prompt", "--listen", "127.0.0.1:0"])
        .args([
            "--admin-listen",
            "127.0.0.1:0",
            "--mcp-listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(dir)
        .arg("--admin-token-file")
        .arg(scratch.admin_token_file())
        .args(extra)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Removes the keying of a keyed log, renumbers what follows, and rewrites
/// every hash as a plain chain: without the key, nothing shows it.
fn unkey(db: &rusqlite::Connection) {
    db.execute_batch(
        "DROP TRIGGER audit_key_no_update; DROP TRIGGER audit_key_no_delete;
         DELETE FROM audit_key; DELETE FROM audit WHERE kind = 'audit-keyed';
         UPDATE audit SET seq = seq - 1;",
    )
    .unwrap();
    rehash_everything(db);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_verify_finds_with_the_key_of_a_keyed_chain() {
    let scratch = Scratch::new("audit-keyed");
    let dir = scratch.data_dir();
    let key_file = scratch.root().join("keys").join("audit.key");
    let key_arg = [
        std::ffi::OsStr::new("--audit-key-file"),
        key_file.as_os_str(),
    ];
    // A key file inside the data directory is refused.
    std::fs::create_dir_all(&dir).unwrap();
    let inside = dir.join("audit.key");
    let error = refused_start(
        &scratch,
        &dir,
        &[std::ffi::OsStr::new("--audit-key-file"), inside.as_os_str()],
    );
    assert!(error.contains("is inside the data directory"), "{error}");
    assert!(!inside.exists());

    let vessel = start_with(&scratch, &key_arg);
    let added = person(&dir, &["agents", "add", "bot", "--json"]);
    succeeded(&added);
    let admin = vessel.admin(&scratch);
    for _ in 0..3 {
        call(&admin, "device__desk_lamp__read_light", json!({})).await;
    }
    vessel.interrupt();
    // 1 keys the chain, 2 makes the vessel's key, 3 starts it, 4 adds the
    // agent, 5 to 7 are decisions, 8 stops it.
    let entries = audit_entries(&dir, 100);
    let kinds: Vec<&str> = entries
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "audit-keyed",
            "vessel-key",
            "vessel-started",
            "agent",
            "decision",
            "decision",
            "decision",
            "vessel-stopped"
        ]
    );
    let key = key_file.display().to_string();
    let with_key = ["--audit-key-file", key.as_str()];
    let text = verify_says(&dir, &with_key, true);
    assert!(text.contains("checked with the key in "), "{text}");
    // Without the key a keyed chain cannot be checked.
    let text = verify_says(&dir, &[], false);
    assert!(
        text.contains("BROKEN entry 1: key (the chain is keyed from here with key "),
        "{text}"
    );
    // Nor can the vessel start on it.
    let error = refused_start(&scratch, &dir, &[]);
    assert!(
        error.contains("the audit log is keyed from entry 1"),
        "{error}"
    );

    // Each attack, and whether verify finds it with the key alone and with
    // the key and the kept head.
    let attacks: [(&str, Attack, bool, bool); 6] = [
        ("k-untouched", |_| {}, true, true),
        (
            "k-delete-all",
            |db| {
                db.execute_batch("DELETE FROM audit").unwrap();
            },
            false,
            false,
        ),
        (
            "k-rehash-all",
            |db| {
                db.execute_batch("UPDATE audit SET entry = '{}' WHERE seq = 5")
                    .unwrap();
                rehash_everything(db);
            },
            false,
            false,
        ),
        ("k-unkey", unkey, false, false),
        (
            "k-cut-tail",
            |db| {
                db.execute_batch("DELETE FROM audit WHERE seq > 4").unwrap();
            },
            true,
            false,
        ),
        ("k-append-forged", append_forged, false, false),
    ];
    for (name, attack, key_alone, with_head) in attacks {
        tampered_copy(&scratch, name, attack);
        let copy = scratch.root().join(name);
        let mut args = vec!["--no-kept-head"];
        args.extend(with_key);
        verify_says(&copy, &args, key_alone);
        verify_says(&copy, &with_key, with_head);
    }
    // What a rewrite without the key looks like to someone without it.
    verify_says(&scratch.root().join("k-unkey"), &["--no-kept-head"], true);
}

/// `dk audit tail` shows when each entry was recorded in local time with
/// its UTC offset (the zone `TZ` names), to the millisecond; `--json` keeps
/// the raw milliseconds.
#[test]
fn audit_tail_prints_readable_times_and_json_keeps_the_raw_value() {
    let scratch = Scratch::new("times");
    let dir = scratch.data_dir();
    Running::start(&scratch).interrupt();
    let entries = audit_entries(&dir, 100);
    assert!(entries.len() >= 3, "{entries:?}");
    for zone in ["UTC", "Asia/Kolkata", "America/St_Johns"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dk"))
            .args(["audit", "tail", "--data-dir"])
            .arg(&dir)
            .env("TZ", zone)
            .output()
            .unwrap();
        let text = succeeded(&out);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), entries.len(), "{text}");
        for (line, entry) in lines.iter().zip(&entries) {
            let at_ms = entry["atMs"].as_i64().unwrap();
            let shown = jiff::Timestamp::from_millisecond(at_ms)
                .unwrap()
                .to_zoned_datetime(jiff::tz::TimeZone::get(zone).unwrap())
                .strftime("%Y-%m-%d %H:%M:%S%.3f %:z")
                .to_string();
            let seq = format!("#{:<6}", entry["seq"].as_u64().unwrap());
            assert!(
                line.starts_with(&format!(
                    "{seq} {shown} {}",
                    entry["kind"].as_str().unwrap()
                )),
                "{zone}: {line:?}, expected {shown}"
            );
            assert!(!line.contains(&at_ms.to_string()), "{line}");
        }
    }
    // The offsets are the zones': one line is enough to see them.
    let first = |zone: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dk"))
            .args(["audit", "tail", "-n", "1", "--data-dir"])
            .arg(&dir)
            .env("TZ", zone)
            .output()
            .unwrap();
        succeeded(&out)
    };
    assert!(first("UTC").contains(" +00:00 "), "{}", first("UTC"));
    assert!(first("Asia/Kolkata").contains(" +05:30 "));
}

/// A log `dk vessel` wrote before the audit log had a schema of types
/// (`fixtures/audit/schema-1`, keyed with the test key beside it): `dk
/// audit verify` still finds it intact, chain, key, kept head and the
/// state cross-check alike, and `dk audit tail` prints every entry.
#[test]
fn a_log_written_before_the_audit_schema_still_verifies() {
    use std::os::unix::fs::PermissionsExt as _;

    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/audit/schema-1");
    let scratch = Scratch::new("old-log");
    let dir = scratch.root().join("vessel");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    // A checkout keeps no file's mode: the copies get the vessel's back.
    let copy = |name: &str, to: &Path| {
        std::fs::copy(fixture.join(name), to).unwrap();
        std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o600)).unwrap();
    };
    copy("vessel.db", &dir.join("vessel.db"));
    copy("vessel.audit-head", &dir.with_extension("audit-head"));
    let key = scratch.root().join("audit.key");
    copy("audit.key", &key);

    let verify = audit(&dir, &["verify", "--audit-key-file", key.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&verify.stdout);
    assert_eq!(verify.status.code(), Some(0), "{said}");
    assert!(said.contains("intact: 29 entries"), "{said}");

    let entries = audit_entries(&dir, 100);
    assert_eq!(entries.len(), 29);
    assert_eq!(entries[0]["kind"], "audit-keyed");
    assert_eq!(entries[28]["kind"], "vessel-stopped");
}
