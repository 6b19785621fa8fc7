//! Where `dk vessel` keeps its files and who may touch them: a private home
//! found through `DK_HOME` (or the XDG default) from any directory, a 0700
//! data directory, 0600 files, an admin token file that is refused unless it
//! is a regular 0600 file of ours and never written through a link, one
//! vessel per home, files and sockets removed on SIGTERM, and the person's
//! commands that never give the token to whoever took a port the vessel
//! left.

use std::io::ErrorKind;
use std::net::TcpListener;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::process::{PATIENCE, Running, Scratch, succeeded};

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

#[track_caller]
fn failed(out: &Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stderr.clone()).unwrap()
}

/// Runs `command` (a `dk vessel` expected to refuse to start) to its end;
/// one that keeps running is killed and fails the test.
fn refused_start(mut command: Command) -> String {
    let mut child = command
        .args(["--no-prompt", "--listen", "127.0.0.1:0"])
        .args([
            "--admin-listen",
            "127.0.0.1:0",
            "--mcp-listen",
            "127.0.0.1:0",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("dk vessel started where it should have refused to");
        }
        // Looks every 10 ms for the exit; past PATIENCE the process is
        // killed first, so none is left behind (a wait that fails cannot).
        std::thread::sleep(Duration::from_millis(10));
    }
    failed(&child.wait_with_output().unwrap())
}

/// A private file of another user: made and given away where the test may
/// (as root), else one root owns already.
fn not_ours(scratch: &Scratch, what: &str) -> std::path::PathBuf {
    let uid = std::fs::metadata(scratch.root()).unwrap().uid();
    if uid == 0 {
        let path = scratch.root().join(what);
        std::fs::write(&path, "x").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
        path
    } else {
        // Owned by root, and readable.
        "/etc/passwd".into()
    }
}

#[test]
fn the_home_the_data_directory_and_their_files_are_private() {
    let scratch = Scratch::new("private");
    let vessel = Running::start_with(&scratch, &["--mcp-listen", "127.0.0.1:0"]);
    let home = scratch.home();
    let data = scratch.data_dir();
    assert_eq!(mode(&home), 0o700);
    assert_eq!(mode(&data), 0o700);
    for file in [
        scratch.admin_token_file(),
        data.join("vessel.json"),
        data.join("vessel.db"),
    ] {
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }
    for socket in ["admin.sock", "mcp.sock"] {
        let meta = std::fs::symlink_metadata(data.join(socket)).unwrap();
        assert!(meta.file_type().is_socket(), "{socket}");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{socket}");
    }
    let address: Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("vessel.json")).unwrap()).unwrap();
    assert_eq!(address["pid"], json!(vessel.child.as_ref().unwrap().id()));
    assert_eq!(address["admin"], json!(vessel.admin.to_string()));
    assert_eq!(address["mcp"], json!(vessel.mcp));
    assert_eq!(
        address["adminSocket"],
        json!(data.join("admin.sock").to_str().unwrap())
    );
    assert_eq!(
        address["mcpSocket"],
        json!(data.join("mcp.sock").to_str().unwrap())
    );
    // Nothing but these: no temporary file left behind. The head file is
    // rewritten after commits (through a temporary name, renamed over it),
    // so one may be seen mid-write: it must be gone a moment later.
    let listing = || {
        let mut names: Vec<String> = std::fs::read_dir(&home)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    let mut names = listing();
    dk_testkit::eventually_blocking("the home's files", || {
        names = listing();
        names == ["admin-token", "vessel", "vessel.audit-head", "vessel.key"]
    });
    assert_eq!(
        names,
        ["admin-token", "vessel", "vessel.audit-head", "vessel.key"]
    );
    // The data directory holds no secret: the vessel's key is beside the
    // admin token.
    assert_eq!(mode(&home.join("vessel.key")), 0o600);
    assert!(!data.join("vessel.key").exists());
    let head = std::fs::metadata(home.join("vessel.audit-head")).unwrap();
    assert_eq!(head.permissions().mode() & 0o777, 0o600);
    let said = vessel.said("find this vessel");
    assert!(
        said.contains(&format!(
            "home                 {} (from DK_HOME)",
            home.display()
        )),
        "{said}"
    );
    assert!(said.contains("find this vessel through DK_HOME"), "{said}");
}

#[test]
fn an_open_data_directory_of_ours_is_closed_and_another_users_is_refused() {
    let scratch = Scratch::new("tighten");
    std::fs::create_dir_all(scratch.data_dir()).unwrap();
    for dir in [scratch.home(), scratch.data_dir()] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let vessel = Running::start(&scratch);
    assert_eq!(mode(&scratch.home()), 0o700);
    assert_eq!(mode(&scratch.data_dir()), 0o700);
    let said = vessel.complained();
    for dir in [scratch.home(), scratch.data_dir()] {
        let note = format!("note: `{}` had mode 0755; it is now 0700", dir.display());
        assert!(said.contains(&note), "{said}");
    }
    vessel.terminate();

    let theirs = if std::fs::metadata(scratch.root()).unwrap().uid() == 0 {
        let dir = scratch.root().join("theirs");
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
        dir
    } else {
        "/".into()
    };
    let mut command = scratch.dk(&["vessel", "--data-dir"]);
    command.arg(&theirs);
    let said = refused_start(command);
    assert!(
        said.contains(&format!("`{}` belongs to another user", theirs.display())),
        "{said}"
    );
}

/// What is planted at the admin token's path before the vessel starts.
#[derive(Debug, Clone, Copy)]
enum Planted {
    Mode(u32),
    Directory,
    LinkToOurToken,
    LinkToNowhere,
    AnotherUsersFile,
}

#[track_caller]
fn check_token_refused(planted: Planted, expected: &str) {
    let scratch = Scratch::new("token-refused");
    let token = scratch.admin_token_file();
    std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
        .create(scratch.home())
        .unwrap();
    // A good token elsewhere, which a link must not make the vessel adopt
    // or change.
    let elsewhere = scratch.root().join("elsewhere");
    dk_http::AdminToken::generate()
        .write_to(&elsewhere)
        .unwrap();
    let before = std::fs::read(&elsewhere).unwrap();
    let nowhere = scratch.root().join("nowhere");
    let theirs = matches!(planted, Planted::AnotherUsersFile).then(|| not_ours(&scratch, "theirs"));
    let mut command = scratch.dk(&["vessel"]);
    match planted {
        Planted::Mode(m) => {
            dk_http::AdminToken::generate().write_to(&token).unwrap();
            std::fs::set_permissions(&token, std::fs::Permissions::from_mode(m)).unwrap();
        }
        Planted::Directory => std::fs::create_dir(&token).unwrap(),
        Planted::LinkToOurToken => std::os::unix::fs::symlink(&elsewhere, &token).unwrap(),
        Planted::LinkToNowhere => std::os::unix::fs::symlink(&nowhere, &token).unwrap(),
        Planted::AnotherUsersFile => {
            command
                .arg("--admin-token-file")
                .arg(theirs.as_ref().unwrap());
        }
    }
    let said = refused_start(command);
    let path = theirs.unwrap_or_else(|| token.clone());
    let expected = expected.replace("PATH", path.to_str().unwrap());
    assert!(
        said.starts_with("error: the admin token file is refused: ") && said.contains(&expected),
        "{planted:?}: {said}"
    );
    assert_eq!(std::fs::read(&elsewhere).unwrap(), before, "{planted:?}");
    assert!(!nowhere.exists(), "{planted:?}");
    assert!(!scratch.data_dir().join("vessel.json").exists());
}

#[test]
fn a_token_file_that_is_not_a_private_regular_file_of_ours_stops_the_vessel() {
    let link = "`PATH` is a symbolic link, which dk does not follow for its private files; remove it, or name another file with --admin-token-file";
    check_token_refused(
        Planted::Mode(0o644),
        "`PATH` has mode 0644, not 0600: other users may read it; remove it and start the vessel again to make a new token",
    );
    check_token_refused(Planted::Mode(0o660), "`PATH` has mode 0660, not 0600");
    check_token_refused(
        Planted::Directory,
        "`PATH` is a directory, not a regular file",
    );
    check_token_refused(Planted::LinkToOurToken, link);
    check_token_refused(Planted::LinkToNowhere, link);
    check_token_refused(Planted::AnotherUsersFile, "`PATH` belongs to another user");
}

#[test]
fn a_link_planted_at_the_old_temporary_name_is_not_followed() {
    let scratch = Scratch::new("token-link");
    std::fs::create_dir_all(scratch.home()).unwrap();
    let victim = scratch.root().join("victim");
    std::fs::write(&victim, "unchanged").unwrap();
    let planted = scratch.home().join("admin-token.tmp");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    let vessel = Running::start(&scratch);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "unchanged");
    let token = std::fs::symlink_metadata(scratch.admin_token_file()).unwrap();
    assert!(token.is_file() && token.mode() & 0o7777 == 0o600);
    assert!(
        std::fs::symlink_metadata(&planted)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    // The token it wrote is the one its admin API takes.
    let out = scratch.run(&["pairings", "--json"]);
    assert_eq!(succeeded(&out).trim(), "[]");
    drop(vessel);
}

#[test]
fn sigterm_and_sigint_remove_the_address_file_and_the_sockets() {
    for stop in [Running::terminate as fn(Running), Running::interrupt] {
        let scratch = Scratch::new("stop");
        let vessel = Running::start(&scratch);
        let data = scratch.data_dir();
        let made = ["vessel.json", "admin.sock", "mcp.sock"];
        for name in made {
            assert!(data.join(name).exists(), "{name}");
        }
        stop(vessel);
        for name in made {
            assert!(!data.join(name).exists(), "{name} is left");
        }
        assert!(data.join("vessel.db").exists());
        let said = failed(&scratch.run(&["pairings"]));
        assert!(said.contains("no vessel runs in"), "{said}");
    }
}

#[test]
fn the_persons_commands_find_the_vessel_from_any_directory() {
    // Through DK_HOME, from a directory that has nothing to do with it.
    let scratch = Scratch::new("anywhere");
    let vessel = Running::start(&scratch);
    let elsewhere = tempfile::TempDir::new().unwrap();
    for args in [
        &["pairings", "--json"][..],
        &["approvals", "--json"],
        &["devices", "--json"],
        &["agents", "list", "--json"],
    ] {
        let out = scratch
            .dk(args)
            .current_dir(elsewhere.path())
            .output()
            .unwrap();
        assert_eq!(succeeded(&out).trim(), "[]", "{args:?}");
    }
    let out = scratch
        .dk(&["audit", "verify"])
        .current_dir(elsewhere.path())
        .output()
        .unwrap();
    succeeded(&out);
    drop(vessel);

    // Without DK_HOME: $XDG_DATA_HOME/dk, else ~/.local/share/dk.
    let cases: [(&[(&str, &str)], &str); 2] = [
        (&[("XDG_DATA_HOME", "xdg"), ("HOME", "nobody")], "xdg/dk"),
        (&[("HOME", "h")], "h/.local/share/dk"),
    ];
    for (env, home) in cases {
        let scratch = Scratch::new("default-home");
        let with_env = |args: &[&str]| {
            let mut command = Command::new(env!("CARGO_BIN_EXE_dk"));
            command
                .args(args)
                .env_remove("DK_HOME")
                .env_remove("XDG_DATA_HOME")
                .current_dir(elsewhere.path());
            for (name, value) in env {
                command.env(name, scratch.root().join(value));
            }
            command
        };
        let mut child = with_env(&["vessel", "--no-prompt", "--listen", "127.0.0.1:0"])
            .args([
                "--admin-listen",
                "127.0.0.1:0",
                "--mcp-listen",
                "127.0.0.1:0",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let vessel_json = scratch.root().join(home).join("vessel/vessel.json");
        dk_testkit::eventually_blocking("dk vessel starting", || {
            assert!(child.try_wait().unwrap().is_none(), "dk vessel exited");
            vessel_json.exists()
        });
        let out = with_env(&["pairings", "--json"]).output().unwrap();
        let listed = succeeded(&out);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(listed.trim(), "[]", "{env:?}");
    }
}

#[test]
fn a_second_vessel_in_the_same_home_is_refused() {
    let scratch = Scratch::new("second");
    let first = Running::start(&scratch);
    let address = std::fs::read_to_string(scratch.data_dir().join("vessel.json")).unwrap();
    let said = refused_start(scratch.dk(&["vessel"]));
    assert_eq!(
        said.trim(),
        format!(
            "error: a vessel already runs in `{}`",
            scratch.data_dir().display()
        )
    );
    // The first is untouched: its files, its sockets, its answers.
    assert_eq!(
        std::fs::read_to_string(scratch.data_dir().join("vessel.json")).unwrap(),
        address
    );
    assert_eq!(
        succeeded(&scratch.run(&["pairings", "--json"])).trim(),
        "[]"
    );
    drop(first);
}

/// Nothing connected to `listener` (non-blocking) since it was bound.
#[track_caller]
fn untouched(listener: &TcpListener, what: &str) {
    match listener.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        Err(e) => panic!("{what}: {e}"),
        Ok((_, peer)) => panic!("{what}: {peer} connected to the squatter"),
    }
}

#[test]
fn whoever_takes_the_ports_of_a_dead_vessel_hears_nothing_from_dk() {
    let scratch = Scratch::new("squat");
    let vessel = Running::start_with(&scratch, &["--mcp-listen", "127.0.0.1:0"]);
    let (admin, mcp) = (vessel.admin, vessel.mcp.clone().unwrap());
    let agent = scratch.run(&["agents", "add", "main", "--json"]);
    let credential: Value = serde_json::from_str(&succeeded(&agent)).unwrap();
    let credential = credential["credential"].as_str().unwrap().to_owned();
    // Killed: its vessel.json stays, naming the ports.
    vessel.kill();
    assert!(scratch.data_dir().join("vessel.json").exists());
    let squat_admin = TcpListener::bind(admin).unwrap();
    let squat_mcp = TcpListener::bind(&mcp).unwrap();
    squat_admin.set_nonblocking(true).unwrap();
    squat_mcp.set_nonblocking(true).unwrap();

    for args in [
        &["pairings"][..],
        &["approvals"],
        &["devices"],
        &["agents", "list"],
    ] {
        let said = failed(&scratch.run(args));
        assert!(
            said.contains(&format!(
                "no vessel runs in `{}`",
                scratch.data_dir().display()
            )),
            "{args:?}: {said}"
        );
    }
    let mut bridge = scratch
        .dk(&["mcp"])
        .env("DK_AGENT_CREDENTIAL", &credential)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = bridge.stdin.take().unwrap();
        let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "it", "version": "1"}}});
        writeln!(stdin, "{initialize}").unwrap();
    }
    let out = bridge.wait_with_output().unwrap();
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["error"]["data"]["reachable"], false, "{answer}");
    untouched(&squat_admin, "the admin port");
    untouched(&squat_mcp, "the MCP port");
}

/// A dk/2 lamp with its key file, running until stopped or refused.
struct Dk2Lamp {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), dk_device::ClientError>>,
    codes: std::sync::Arc<std::sync::Mutex<usize>>,
}

impl Dk2Lamp {
    fn spawn(url: &str, key_file: &Path) -> Dk2Lamp {
        let codes = std::sync::Arc::new(std::sync::Mutex::new(0));
        let seen = std::sync::Arc::clone(&codes);
        let options = dk_device::ClientOptions::new(url)
            .key_file(key_file)
            .on_code(move |_| *seen.lock().unwrap() += 1)
            .backoff(Duration::from_millis(20), Duration::from_millis(100));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            dk_device::run_client(&dk_device::samples::lamp(), options, async move {
                let _ = stopped.await;
            })
            .await
        });
        Dk2Lamp {
            stop: Some(stop),
            task,
            codes,
        }
    }

    /// How the client ended, by itself.
    async fn ended(self) -> Result<(), dk_device::ClientError> {
        let Dk2Lamp { stop, task, .. } = self;
        let ended = tokio::time::timeout(PATIENCE, task).await.unwrap().unwrap();
        drop(stop);
        ended
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(PATIENCE, self.task).await.unwrap();
    }
}

/// Copies dk's home `from` to `to`, leaving out the files named in `secrets`.
fn copy_home(from: &Path, to: &Path, secrets: &[&str]) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        if secrets.contains(&name.as_str()) {
            continue;
        }
        if entry.file_type().unwrap().is_dir() {
            copy_home(&entry.path(), &to.join(&name), &[]);
        } else if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.join(&name)).unwrap();
        }
    }
}

/// `set_light` through the admin API of `vessel`: its answer.
async fn switch_on(vessel: &Running, scratch: &Scratch) -> Value {
    let answer = vessel
        .admin(scratch)
        .post(
            "/v1/tools/call",
            &json!({"tool": "device__desk_lamp__set_light", "input": {"on": true}}),
        )
        .await
        .unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.body
}

/// The case: a copy of dk's home without its secrets (a backup, a
/// synced folder) started as a vessel. The vessel's key is not in the data
/// directory, so the copy cannot start as the vessel the lamp pinned:
/// without a word it refuses to start; told to make a new key, the lamp's
/// pin refuses it. A copy made on purpose with the key is the vessel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_of_the_home_without_its_secrets_cannot_pass_for_the_vessel() {
    let scratch = Scratch::new("original");
    let vessel = Running::start(&scratch);
    let lamp_key = scratch.root().join("lamp.key");
    let lamp = Dk2Lamp::spawn(&vessel.url(), &lamp_key);
    crate::process::approve_when_asked(&vessel.admin(&scratch), "desk-lamp", &["set_light"]).await;
    let on = crate::process::eventually("the lamp answering", || async {
        let answer = switch_on(&vessel, &scratch).await;
        (answer["ok"] == true).then_some(answer)
    })
    .await;
    assert_eq!(on["ok"], true);
    lamp.stop().await;
    vessel.interrupt();

    // The secret is beside the admin token, not in the data directory.
    let key_file = scratch.home().join("vessel.key");
    assert_eq!(mode(&key_file), 0o600);
    assert!(!scratch.data_dir().join("vessel.key").exists());

    // The copy without the secrets: refused, saying why and what to do.
    let copy = Scratch::new("copy");
    copy_home(
        &scratch.home(),
        &copy.home(),
        &["admin-token", "vessel.key"],
    );
    let said = refused_start(copy.dk(&["vessel"]));
    assert!(
        said.contains("is missing, but this data directory's vessel had a key (1 paired dk/2 device pinned it)")
            && said.contains("--new-vessel-key"),
        "{said}"
    );
    // Told to make a new key, it starts: the lamp's pin refuses it and
    // never says who it is.
    let impostor = Running::start_with(&copy, &["--new-vessel-key"]);
    let ended = Dk2Lamp::spawn(&impostor.url(), &lamp_key).ended().await;
    assert!(
        matches!(ended, Err(dk_device::ClientError::VesselKeyChanged { .. })),
        "{ended:?}"
    );
    let refused = switch_on(&impostor, &copy).await;
    assert_eq!(refused["ok"], false, "{refused}");
    let pending = impostor.admin(&copy).get("/v1/pending").await.unwrap();
    assert_eq!(pending.body, json!([]));
    impostor.interrupt();
    // A new key is never made over one that is there.
    let said = refused_start(copy.dk(&["vessel", "--new-vessel-key"]));
    assert!(said.contains("would replace the key"), "{said}");

    // Moving the vessel on purpose: the data directory and the key (the
    // admin token is made anew if left behind).
    let moved = Scratch::new("moved");
    copy_home(&scratch.home(), &moved.home(), &["admin-token"]);
    let vessel = Running::start(&moved);
    let lamp = Dk2Lamp::spawn(&vessel.url(), &lamp_key);
    let on = crate::process::eventually("the lamp answering the moved vessel", || async {
        let answer = switch_on(&vessel, &moved).await;
        (answer["ok"] == true).then_some(answer)
    })
    .await;
    assert_eq!(on["ok"], true);
    assert_eq!(
        *lamp.codes.lock().unwrap(),
        0,
        "the lamp asked to pair again"
    );
    lamp.stop().await;
    // The copy's key in the moved home: refused as not the pinned one.
    vessel.interrupt();
    std::fs::copy(
        copy.home().join("vessel.key"),
        moved.home().join("vessel.key"),
    )
    .unwrap();
    let said = refused_start(moved.dk(&["vessel"]));
    assert!(
        said.contains("not the one this data directory's devices pinned"),
        "{said}"
    );
}

/// A vessel key an older dk left in the data directory is moved out of it
/// at start (0600, the same key), and the person told; a different key
/// already outside is never overwritten.
#[test]
fn a_key_left_in_an_old_data_directory_is_moved_out_of_it() {
    let scratch = Scratch::new("old-key");
    let vessel = Running::start(&scratch);
    let fingerprint = |said: &str| {
        said.lines()
            .find_map(|l| l.trim().strip_prefix("vessel fingerprint"))
            .map(|rest| rest.split_whitespace().next().unwrap().to_owned())
            .unwrap()
    };
    let first = fingerprint(&vessel.said("vessel key"));
    vessel.interrupt();
    let (outside, inside) = (
        scratch.home().join("vessel.key"),
        scratch.data_dir().join("vessel.key"),
    );
    let key = std::fs::read(&outside).unwrap();
    std::fs::rename(&outside, &inside).unwrap();

    let vessel = Running::start(&scratch);
    assert_eq!(fingerprint(&vessel.said("vessel key")), first);
    let complained = vessel.complained();
    assert!(
        complained.contains(&format!(
            "note: moved the vessel's secret key from `{}` to `{}` (0600)",
            inside.display(),
            outside.display()
        )),
        "{complained}"
    );
    assert!(!inside.exists());
    assert_eq!(mode(&outside), 0o600);
    assert_eq!(std::fs::read(&outside).unwrap(), key);
    vessel.interrupt();
    let moved = crate::process::audit_entries(&scratch.data_dir(), 1000)
        .into_iter()
        .find(|e| e["kind"] == "vessel-key" && e["entry"]["moved"] == true)
        .unwrap();
    assert_eq!(moved["entry"]["fingerprint"], json!(first));

    // Another key left inside while one is outside: refused, neither lost.
    let other = format!("{}\n", "ab".repeat(32));
    std::fs::write(&inside, &other).unwrap();
    std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(0o600)).unwrap();
    let said = refused_start(scratch.dk(&["vessel"]));
    assert!(said.contains("differs from the one in"), "{said}");
    assert_eq!(std::fs::read(&outside).unwrap(), key);
    assert_eq!(std::fs::read_to_string(&inside).unwrap(), other);
}
