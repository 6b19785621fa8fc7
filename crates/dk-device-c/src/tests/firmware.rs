//! The firmware build itself (`libdk_device.a` from `cargo xtask
//! firmware`: opt-level z, panic=abort, the platform's allocator as the
//! global one) under an allocator that refuses: `tests/harness.c`, a lamp
//! driven line by line, linked with it, and this side playing the vessel.
//! Before any allocator exists, creating a device is refused with a
//! status; then each allocation of a device's creation, of a pairing and
//! of a call is refused in turn, and every time the library answers with
//! a status (never an abort: the harness would die of SIGABRT), ends the
//! connection cleanly, frees all it held, and pairs and serves afterwards.
//!
//! Without gcc the tests say so and pass, unless `DK_REQUIRE_PEERS` is set.

#![allow(clippy::undocumented_unsafe_blocks)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::OnceLock;

use super::Vessel;
use crate::{dk_end, dk_output_kind, dk_status};

/// The harness linked with the firmware build, built once per run; `None`
/// (said out loud) without gcc when peers are not required.
fn harness() -> Option<PathBuf> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let gcc = Command::new("gcc").arg("--version").output();
            if !gcc.is_ok_and(|out| out.status.success()) {
                assert!(
                    std::env::var_os("DK_REQUIRE_PEERS").is_none(),
                    "gcc is missing and DK_REQUIRE_PEERS is set"
                );
                eprintln!("the firmware build's tests: skipped: gcc is not installed");
                return None;
            }
            let said = dk_testkit::firmware_build();
            let path = |name: &str| {
                said.lines()
                    .find_map(|line| line.strip_prefix(name))
                    .map(PathBuf::from)
                    .unwrap()
            };
            let (library, header) = (path("library: "), path("header: "));
            let harness = library.with_file_name("harness");
            let built = Command::new("gcc")
                .args(["-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror"])
                .arg("-I")
                .arg(header.parent().unwrap())
                .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/harness.c"))
                .arg(&library)
                .arg("-o")
                .arg(&harness)
                .output()
                .unwrap();
            assert!(
                built.status.success(),
                "gcc harness.c: {}",
                String::from_utf8_lossy(&built.stderr)
            );
            Some(harness)
        })
        .clone()
}

/// What the harness made of one device call.
#[derive(Debug, Default)]
struct Answer {
    status: i32,
    /// Each output: its kind, end, close code and bytes.
    outs: Vec<(i32, i32, u16, Vec<u8>)>,
    /// The statuses the handler's replies were answered.
    replies: Vec<i32>,
}

impl Answer {
    fn binaries(&self) -> Vec<Vec<u8>> {
        self.outs
            .iter()
            .filter(|out| out.0 == dk_output_kind::DK_OUTPUT_SEND_BINARY as i32)
            .map(|out| out.3.clone())
            .collect()
    }

    /// Whether the connection ended for want of memory, which a status of
    /// `DK_ERR_NO_MEMORY` (of the call or of a reply) must come with.
    fn ran_out(&self) -> bool {
        let no_memory = dk_status::DK_ERR_NO_MEMORY as i32;
        let short = self.status == no_memory
            || self
                .replies
                .iter()
                .any(|r| *r == no_memory || *r == dk_status::DK_ERR_NO_SUCH_CALL as i32);
        let ended = self
            .outs
            .iter()
            .find(|out| out.0 == dk_output_kind::DK_OUTPUT_ENDED as i32);
        assert!(
            [dk_status::DK_OK as i32, no_memory].contains(&self.status),
            "{self:?}"
        );
        if let Some((_, end, _, why)) = ended {
            assert_eq!(*end, dk_end::DK_END_RETRY as i32, "{self:?}");
            assert_eq!(
                String::from_utf8_lossy(why),
                "the device ran out of memory: connect again after a backoff"
            );
        }
        assert!(
            !short || ended.is_some() || self.status == no_memory,
            "{self:?}"
        );
        short || ended.is_some()
    }
}

/// A running harness.
struct Harness {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Harness {
    fn start(path: &Path) -> Harness {
        let mut child = Command::new(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let input = child.stdin.take().unwrap();
        let output = BufReader::new(child.stdout.take().unwrap());
        Harness {
            child,
            input,
            output,
        }
    }

    /// Sends a command; the lines it answered, `done` left out.
    fn say(&mut self, command: &str) -> Vec<String> {
        writeln!(self.input, "{command}").unwrap();
        self.input.flush().unwrap();
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            if self.output.read_line(&mut line).unwrap() == 0 {
                let status = self.child.wait().unwrap();
                panic!("the harness died on `{command:.40}`: {status}, after {lines:?}");
            }
            let line = line.trim_end().to_owned();
            if line == "done" {
                return lines;
            }
            lines.push(line);
        }
    }

    /// A device call and the poll after it.
    fn device(&mut self, command: &str) -> Answer {
        let mut answer = Answer::default();
        for line in self.say(command) {
            let words: Vec<&str> = line.split(' ').collect();
            match words[..] {
                ["status", status] => answer.status = status.parse().unwrap(),
                ["reply", status] => answer.replies.push(status.parse().unwrap()),
                ["out", kind, end, code, bytes] => answer.outs.push((
                    kind.parse().unwrap(),
                    end.parse().unwrap(),
                    code.parse().unwrap(),
                    unhex(bytes),
                )),
                _ => panic!("{line}"),
            }
        }
        answer
    }

    fn plan(&mut self, plan: &str) {
        self.say(&format!("plan {plan}"));
    }

    /// `(asked, refused, live)`.
    fn stats(&mut self) -> (usize, usize, usize) {
        let line = self.say("stats").remove(0);
        let words: Vec<usize> = line
            .split(' ')
            .skip(1)
            .step_by(2)
            .map(|w| w.parse().unwrap())
            .collect();
        (words[0], words[1], words[2])
    }

    /// Makes the lamp's device: its status and error text.
    fn new_device(&mut self) -> (i32, String) {
        let line = self.say("new").remove(0);
        let rest = line.strip_prefix("status ").unwrap();
        let (status, why) = rest.split_once(' ').unwrap_or((rest, ""));
        (status.parse().unwrap(), why.to_owned())
    }

    /// Sends `frame` sealed by `vessel`, record by record.
    fn tell(&mut self, vessel: &mut Vessel, frame: &str) -> Result<Answer, Answer> {
        let records = vessel.seal(frame);
        let mut all = Answer::default();
        for record in records {
            let answer = self.device(&format!("recv {}", hex(&record)));
            if answer.ran_out() {
                return Err(answer);
            }
            all.outs.extend(answer.outs);
            all.replies.extend(answer.replies);
        }
        Ok(all)
    }

    /// A connection to `vessel`, its handshake and its pairing (or its
    /// authentication by key), as far as it goes.
    fn connection(&mut self, vessel: &mut Vessel) -> Result<(), Answer> {
        vessel.restart();
        let started = self.device("connect");
        if started.ran_out() {
            return Err(started);
        }
        let second = vessel.second(&started.binaries()[0]);
        let shaken = self.device(&format!("recv {}", hex(&second)));
        if shaken.ran_out() {
            return Err(shaken);
        }
        let mut sent = shaken.binaries().into_iter();
        vessel.third(&sent.next().unwrap());
        let frames: Vec<String> = sent.filter_map(|b| vessel.open(&b)).collect();
        if frames[0].contains("device:auth") {
            return Ok(());
        }
        assert!(frames[0].contains("device:hello"), "{frames:?}");
        let commitment = dk_channel::commitment(&vessel.nv, &vessel.hash());
        let commit = format!(
            r#"{{"type":"device:pair-commit","commitment":"{}"}}"#,
            dk_channel::to_hex32(&commitment)
        );
        let nonce = self.tell(vessel, &commit)?;
        assert!(!nonce.binaries().is_empty(), "{nonce:?}");
        for record in nonce.binaries() {
            vessel.open(&record);
        }
        let reveal = format!(
            r#"{{"type":"device:pair-reveal","nonce":"{}"}}"#,
            dk_channel::to_hex32(&vessel.nv)
        );
        let shown = self.tell(vessel, &reveal)?;
        let code = dk_output_kind::DK_OUTPUT_SHOW_CODE as i32;
        assert!(shown.outs.iter().any(|out| out.0 == code), "{shown:?}");
        self.tell(vessel, r#"{"type":"device:paired"}"#)?;
        Ok(())
    }

    /// A call of `set_light` with a note of `note` bytes: `Ok` once its
    /// result came back.
    fn call(&mut self, vessel: &mut Vessel, id: &str, note: usize) -> Result<(), Answer> {
        let note = "n".repeat(note);
        let frame = format!(
            r#"{{"type":"device:invoke","callId":"{id}","capability":"set_light","input":{{"on":true,"note":"{note}"}}}}"#
        );
        let answer = self.tell(vessel, &frame)?;
        let result = answer
            .binaries()
            .iter()
            .filter_map(|b| vessel.open(b))
            .find(|f| f.contains(id))
            .unwrap_or_else(|| panic!("no result: {answer:?}"));
        assert!(
            result.contains(r#""brightness":37"#) || result.contains("out of memory"),
            "{result}"
        );
        Ok(())
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    if text == "-" {
        return Vec::new();
    }
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(&text[at..at + 2], 16).unwrap())
        .collect()
}

fn plans(count: usize) -> impl Iterator<Item = String> {
    (1..=count + 1).flat_map(|n| [format!("from {n}"), format!("once {n}")])
}

#[test]
fn before_any_allocator_a_device_is_refused_with_a_status() {
    let Some(path) = harness() else { return };
    let mut harness = Harness::start(&path);
    let said = harness.say("early");
    assert_eq!(
        said,
        [
            format!(
                "status {} none no platform callbacks",
                dk_status::DK_ERR_NULL as i32
            ),
            format!(
                "status {} none the platform needs alloc and free callbacks, the same for every device",
                dk_status::DK_ERR_PLATFORM as i32
            ),
            format!("status {}", dk_status::DK_ERR_PLATFORM as i32),
        ]
    );
    // And the library still takes a whole platform after.
    assert_eq!(harness.new_device().0, 0);
}

#[test]
fn the_firmware_build_refused_memory_at_each_allocation_answers_with_a_status() {
    let Some(path) = harness() else { return };
    let mut harness = Harness::start(&path);

    // Creating a device.
    assert_eq!(harness.new_device().0, 0);
    let (made, _, _) = harness.stats();
    harness.say("free");
    for plan in plans(made) {
        harness.plan(&plan);
        let (status, why) = harness.new_device();
        let (_, refused, _) = harness.stats();
        if status != 0 {
            assert_eq!(
                (status, why.as_str()),
                (dk_status::DK_ERR_NO_MEMORY as i32, "out of memory"),
                "{plan}"
            );
            assert!(refused > 0, "{plan}");
        }
        harness.say("free");
        harness.plan("plenty 0");
        assert_eq!(harness.stats().2, 0, "{plan}: memory held after the free");
    }

    // A pairing, then a call of 16 bytes and one of 16 KiB.
    harness.new_device();
    harness.plan("plenty 0");
    harness.connection(&mut Vessel::new(42)).unwrap();
    let (pairing, _, _) = harness.stats();
    harness.say("free");
    let mut ended = 0;
    for plan in plans(pairing) {
        harness.new_device();
        let mut vessel = Vessel::new(42);
        harness.plan(&plan);
        let paired = harness.connection(&mut vessel);
        harness.plan("plenty 0");
        if paired.is_err() {
            ended += 1;
            harness.connection(&mut vessel).unwrap();
        }
        harness.call(&mut vessel, "after", 16).unwrap();
        harness.say("free");
        assert_eq!(harness.stats().2, 0, "{plan}: memory held after the free");
    }
    assert!(
        ended > pairing,
        "{ended} pairings ended of {}",
        2 * (pairing + 1)
    );
    for note in [16, 16 * 1024] {
        harness.new_device();
        let mut vessel = Vessel::new(42);
        harness.connection(&mut vessel).unwrap();
        harness.plan("plenty 0");
        harness.call(&mut vessel, "count", note).unwrap();
        let (calling, _, _) = harness.stats();
        harness.say("free");
        for plan in plans(calling) {
            harness.new_device();
            let mut vessel = Vessel::new(42);
            harness.connection(&mut vessel).unwrap();
            harness.plan(&plan);
            let called = harness.call(&mut vessel, "c1", note);
            harness.plan("plenty 0");
            if called.is_err() {
                harness.connection(&mut vessel).unwrap();
            }
            harness.call(&mut vessel, "c2", note).unwrap();
            harness.say("free");
            assert_eq!(harness.stats().2, 0, "{plan}: memory held after the free");
        }
    }
    eprintln!(
        "the firmware build: a device's creation ({made} allocations), a pairing ({pairing}) and a call, each allocation refused in turn"
    );
}

#[test]
fn the_firmware_build_on_a_capped_heap_answers_a_16_kib_call_or_a_status() {
    let Some(path) = harness() else { return };
    let mut harness = Harness::start(&path);
    let mut answered = 0;
    for cap in (0..=48 * 1024).step_by(1024) {
        harness.new_device();
        let mut vessel = Vessel::new(42);
        harness.connection(&mut vessel).unwrap();
        let (_, _, held) = harness.stats();
        harness.plan(&format!("cap {}", held + cap));
        let called = harness.call(&mut vessel, "c1", 16 * 1024);
        harness.plan("plenty 0");
        if called.is_ok() {
            answered += 1;
        } else {
            harness.connection(&mut vessel).unwrap();
        }
        harness.call(&mut vessel, "c2", 16 * 1024).unwrap();
        harness.say("free");
        assert_eq!(
            harness.stats().2,
            0,
            "a cap of {cap}: memory held after the free"
        );
    }
    assert!(
        answered > 0,
        "no 16 KiB call was answered on a heap of 48 KiB"
    );
}

#[test]
fn the_firmware_build_takes_a_calls_frame_and_at_most_8_kib_more() {
    let Some(path) = harness() else { return };
    let mut harness = Harness::start(&path);
    harness.new_device();
    let mut vessel = Vessel::new(42);
    harness.connection(&mut vessel).unwrap();
    for kib in [1usize, 4, 16] {
        let note = kib * 1024;
        let frame_len = format!(
            r#"{{"type":"device:invoke","callId":"m{kib}","capability":"set_light","input":{{"on":true,"note":"{}"}}}}"#,
            "n".repeat(note)
        )
        .len();
        harness.say("peak");
        let (_, _, before) = harness.stats();
        harness.call(&mut vessel, &format!("m{kib}"), note).unwrap();
        let line = harness.say("stats").remove(0);
        let peak: usize = line.rsplit(' ').next().unwrap().parse().unwrap();
        let grew = peak - before;
        eprintln!(
            "the firmware build, a call of {kib} KiB: a frame of {frame_len} bytes, the heap grew by {grew} bytes at its peak"
        );
        assert!(
            grew <= frame_len + 8 * 1024,
            "{grew} bytes for a frame of {frame_len}"
        );
    }
    harness.say("free");
    assert_eq!(harness.stats().2, 0);
}
