//! A Tk program for a test to type into: Debian's `wish` (package `tk`)
//! showing one entry field with the keyboard's focus, which writes the
//! field's whole text on its standard output after every change. Tk reads
//! the keyboard mapping lazily, as many older toolkits do, so what it
//! received is what a real program of that kind would have.

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use super::pixels::{Rect, X11Error};
use crate::PATIENCE;

/// Where Debian's `tk` package puts the windowing shell.
const WISH: &str = "/usr/bin/wish";

/// The program: an entry filling the window, its text written as hex of
/// UTF-8 on every change, commands read from standard input, and `ready`
/// with the window's frame id once the field has the focus.
const SCRIPT: &str = r#"
lassign $argv title geometry
wm title . $title
wm geometry . $geometry
entry .e -textvariable ::v -font {Helvetica 12}
pack .e -fill both -expand 1
set ::v ""
proc report args { puts "text [binary encode hex [encoding convertto utf-8 $::v]]"; flush stdout }
trace add variable ::v write report
fconfigure stdin -blocking 0
fileevent stdin readable {
    if {[gets stdin line] >= 0} { eval $line } elseif {[eof stdin]} { exit }
}
tkwait visibility .e
focus -force .e
update
puts "ready [wm frame .]"
flush stdout
"#;

/// What the program said so far.
#[derive(Default)]
struct Said {
    ready: Option<u32>,
    text: String,
    ended: bool,
}

/// A `wish` showing an entry field at a given place, ended when dropped.
pub struct TkEntry {
    child: Child,
    stdin: ChildStdin,
    said: Arc<(Mutex<Said>, Condvar)>,
    reader: Option<JoinHandle<()>>,
    _script: tempfile::NamedTempFile,
    frame: u32,
}

impl std::fmt::Debug for TkEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TkEntry")
            .field("frame", &self.frame)
            .finish_non_exhaustive()
    }
}

fn decode_hex(hex: &str) -> Option<String> {
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| {
            hex.get(i..i + 2)
                .and_then(|b| u8::from_str_radix(b, 16).ok())
        })
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

impl TkEntry {
    /// Starts `wish` on `display` with a window titled `title` at `at`,
    /// its entry field focused, and waits until it is shown. Fails, saying
    /// how to install it, when `wish` is missing.
    pub fn open(display: &str, title: &str, at: Rect) -> Result<TkEntry, X11Error> {
        if !std::path::Path::new(WISH).is_file() {
            return Err(X11Error(format!(
                "{WISH} is missing: install Debian's `tk` package (`cargo xtask peers` does)"
            )));
        }
        let mut script = tempfile::Builder::new()
            .prefix("dk-tk-")
            .suffix(".tcl")
            .tempfile()
            .map_err(|e| X11Error(format!("cannot write the Tk script: {e}")))?;
        script
            .write_all(SCRIPT.as_bytes())
            .map_err(|e| X11Error(format!("cannot write the Tk script: {e}")))?;
        let geometry = format!("{}x{}+{}+{}", at.width, at.height, at.x, at.y);
        let mut child = Command::new(WISH)
            .arg(script.path())
            .args(["-display", display, "--", title, &geometry])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| X11Error(format!("cannot start {WISH}: {e}")))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(X11Error("wish has no standard input or output".to_owned()));
        };
        let said = Arc::new((Mutex::new(Said::default()), Condvar::new()));
        let shared = Arc::clone(&said);
        let reader = std::thread::spawn(move || {
            let (lock, changed) = &*shared;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let mut said = lock.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(id) = line.strip_prefix("ready ") {
                    let id = id.trim().trim_start_matches("0x");
                    said.ready = u32::from_str_radix(id, 16).ok();
                } else if let Some(text) = line
                    .strip_prefix("text ")
                    .and_then(|hex| decode_hex(hex.trim()))
                {
                    said.text = text;
                }
                changed.notify_all();
            }
            let mut said = lock.lock().unwrap_or_else(PoisonError::into_inner);
            said.ended = true;
            changed.notify_all();
        });
        let mut entry = TkEntry {
            child,
            stdin,
            said,
            reader: Some(reader),
            _script: script,
            frame: 0,
        };
        entry.frame = entry.wait("wish to show its window", |said| said.ready)?;
        Ok(entry)
    }

    /// Waits until `check` gives a value; fails after [`PATIENCE`] or
    /// when the program ended.
    fn wait<T>(
        &self,
        what: &str,
        mut check: impl FnMut(&Said) -> Option<T>,
    ) -> Result<T, X11Error> {
        let (lock, changed) = &*self.said;
        let deadline = Instant::now() + PATIENCE;
        let mut said = lock.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(value) = check(&said) {
                return Ok(value);
            }
            if said.ended {
                return Err(X11Error(format!("wish ended before {what}")));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(X11Error(format!(
                    "timed out waiting for {what}; the field holds {:?}",
                    said.text
                )));
            }
            said = changed
                .wait_timeout(said, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// The window manager's frame of the window (the window itself when
    /// there is no window manager): a child of the root.
    #[must_use]
    pub fn frame(&self) -> u32 {
        self.frame
    }

    /// The field's text now.
    #[must_use]
    pub fn text(&self) -> String {
        let (lock, _) = &*self.said;
        lock.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .text
            .clone()
    }

    /// Waits until the field holds `expected`, and returns it; on a
    /// timeout the error says what it holds.
    pub fn wait_for_text(&self, expected: &str) -> Result<String, X11Error> {
        self.wait(&format!("the field to hold {expected:?}"), |said| {
            (said.text == expected).then(|| said.text.clone())
        })
    }

    /// Runs a Tcl command in the program (`focus -force .e`, `set ::v {}`).
    pub fn tcl(&mut self, command: &str) -> Result<(), X11Error> {
        writeln!(self.stdin, "{command}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| X11Error(format!("cannot send wish a command: {e}")))
    }

    /// Empties the field and waits until it is empty.
    pub fn clear(&mut self) -> Result<(), X11Error> {
        self.tcl("set ::v {}")?;
        self.wait_for_text("").map(|_| ())
    }
}

impl Drop for TkEntry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}
