//! Where `dk device simulate` keeps a device's key and what it refuses to
//! read: by default in dk's home (`DK_HOME`), the same from any directory;
//! a key file another user owns, that others may read, or that is a link
//! is refused, naming the problem, before the vessel hears of the device;
//! a key file an older dk left in `./.dk/` is not used silently.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::process::{Killed, PATIENCE, Running, Scratch, eventually};

/// A valid key file's content (a key nobody paired).
const KEY: &str = r#"{"format":"dk-device-key/1","secret":"5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a","vessel":null,"paired":false}"#;

fn write_key(path: &Path, mode: u32) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, KEY).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Runs `command` (a `dk device simulate` expected to refuse to start) to
/// its end; one that keeps running used what it should have refused, and
/// is killed and fails the test.
fn refused(command: &mut Command) -> Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "the simulator ran on: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        // Looks every 10 ms for the exit; past PATIENCE the process is
        // killed first, so none is left behind (a wait that fails cannot).
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planted_key_file_is_refused_naming_the_problem_and_the_vessel_hears_nothing() {
    let scratch = Scratch::new("planted-key");
    let vessel = Running::start(&scratch);
    let admin = vessel.admin(&scratch);
    let planted = scratch.root().join("planted");
    // Another user's key file, with the right mode.
    let theirs = planted.join("theirs.key");
    write_key(&theirs, 0o600);
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    // One others may read.
    let open = planted.join("open.key");
    write_key(&open, 0o644);
    // A link to a key file of ours, as the planter's own link would be.
    let target = planted.join("target.key");
    write_key(&target, 0o600);
    let link = planted.join("link.key");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let uid = std::fs::metadata(scratch.root()).unwrap().uid();
    let cases = [
        (&theirs, "belongs to another user (uid 65534"),
        (&open, "has mode 0644, not 0600"),
        (&link, "is a symbolic link"),
    ];
    for (path, problem) in cases {
        if uid != 0 && path == &theirs {
            continue; // Only root can give a file away.
        }
        let out = refused(
            scratch
                .dk(&["device", "simulate", "lamp", "--vessel", &vessel.url()])
                .arg("--key-file")
                .arg(path),
        );
        let said = String::from_utf8(out.stderr).unwrap();
        assert!(said.contains(problem), "{}: {said}", path.display());
        assert!(
            said.contains(&path.display().to_string()),
            "the message names the file: {said}"
        );
        // Refused, not fixed or replaced.
        assert_eq!(std::fs::read_to_string(path).unwrap(), KEY);
    }
    assert_eq!(std::fs::metadata(&open).unwrap().mode() & 0o777, 0o644);
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    // The vessel never heard of the device: nobody was asked to pair it.
    assert_eq!(admin.get("/v1/pending").await.unwrap().body, json!([]));
}

/// A `ws://` URL nothing listens on: the simulator makes its key, then
/// tries to connect again and again.
fn nowhere() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("ws://{}/device", listener.local_addr().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_file_is_kept_in_dk_s_home_and_an_old_one_in_dot_dk_is_not_used_silently() {
    let scratch = Scratch::new("device-home");
    let elsewhere = tempfile::TempDir::new().unwrap();
    let url = nowhere();
    let _lamp = Killed(
        scratch
            .dk(&["device", "simulate", "lamp", "--vessel", &url])
            .current_dir(elsewhere.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let key = scratch.home().join("devices").join("desk-lamp.key");
    eventually("the key file in dk's home", || async {
        key.exists().then_some(())
    })
    .await;
    assert_eq!(std::fs::metadata(&key).unwrap().mode() & 0o777, 0o600);
    assert!(!elsewhere.path().join(".dk").exists());
    drop(_lamp);

    // A key file an older dk left in ./.dk/, and none in the home: the
    // simulator says where the file goes now instead of using it.
    let other = Scratch::new("device-old");
    let old = other.root().join(".dk").join("desk-lamp.key");
    write_key(&old, 0o600);
    let out = refused(&mut other.dk(&["device", "simulate", "lamp", "--vessel", &url]));
    let said = String::from_utf8(out.stderr).unwrap();
    let new = other.home().join("devices").join("desk-lamp.key");
    assert!(said.contains(".dk/desk-lamp.key"), "{said}");
    assert!(said.contains(&new.display().to_string()), "{said}");
    assert!(said.contains("mv "), "{said}");
    assert!(!new.exists());
    assert_eq!(std::fs::read_to_string(&old).unwrap(), KEY);
}
