//! The keyboard mapping as the server has it ([`Keyboard`]), and the spare
//! keycodes the device puts the characters it lacks on ([`Spares`]).

use std::time::{Duration, Instant};

use x11rb::connection::Connection as _;
use x11rb::protocol::xproto::ConnectionExt as _;
use x11rb::rust_connection::RustConnection;

use super::link::{XError, finish};
use crate::keys::Keysym;

/// How long a spare keycode keeps the character it was given after its
/// last press before it may be given another. Many programs (Tk, Xlib's
/// own lookup) read a changed mapping only when they handle the key, which
/// may be a while after it was pressed.
pub const REUSE_AFTER: Duration = Duration::from_millis(250);
/// How long programs are given to read a changed keyboard mapping before
/// a key typed with it arrives: Tk, for one, looks a key up as soon as it
/// reads it, before it handles the mapping's change that came just before.
pub const SETTLE: Duration = Duration::from_millis(100);
/// How long after the last key typed with them the spare keycodes are
/// given back (no keysym on them again).
pub const GIVE_BACK_AFTER: Duration = Duration::from_secs(3);

/// The error of a keysym the keyboard has no key for.
pub(super) fn no_key(keysym: Keysym) -> XError {
    XError::Failed(format!(
        "the keyboard has no key for keysym 0x{keysym:x}, which this needs"
    ))
}

/// The keyboard mapping as the server has it.
pub(super) struct Keyboard {
    first: u8,
    per_keycode: usize,
    keysyms: Vec<Keysym>,
}

impl Keyboard {
    pub(super) fn read(conn: &RustConnection) -> Result<Self, XError> {
        let setup = conn.setup();
        let (first, last) = (setup.min_keycode, setup.max_keycode);
        let count = last.saturating_sub(first).saturating_add(1);
        let reply = conn.get_keyboard_mapping(first, count)?.reply()?;
        Ok(Keyboard {
            first,
            per_keycode: usize::from(reply.keysyms_per_keycode).max(1),
            keysyms: reply.keysyms,
        })
    }

    fn codes(&self) -> impl Iterator<Item = (u8, &[Keysym])> {
        self.keysyms
            .chunks(self.per_keycode)
            .enumerate()
            .filter_map(|(i, syms)| {
                u8::try_from(usize::from(self.first) + i)
                    .ok()
                    .map(|c| (c, syms))
            })
    }

    /// The keycode that gives `keysym` and the level it is on (0 plain, 1
    /// with shift); lower keycodes first.
    pub(super) fn find(&self, keysym: Keysym) -> Option<(u8, u8)> {
        for level in 0..2u8 {
            if let Some((code, _)) = self
                .codes()
                .find(|(_, syms)| syms.get(usize::from(level)) == Some(&keysym))
            {
                return Some((code, level));
            }
        }
        None
    }

    /// The keysyms of `code`.
    fn syms(&self, code: u8) -> &[Keysym] {
        let at = usize::from(code.saturating_sub(self.first)) * self.per_keycode;
        self.keysyms.get(at..at + self.per_keycode).unwrap_or(&[])
    }

    /// Keycodes with no keysym at all.
    fn spares(&self) -> Vec<u8> {
        self.codes()
            .filter(|&(code, _)| code > 8)
            .filter(|(_, syms)| syms.iter().all(|&s| s == 0))
            .map(|(c, _)| c)
            .collect()
    }

    fn set(&mut self, code: u8, keysym: Keysym) {
        let at = usize::from(code.saturating_sub(self.first)) * self.per_keycode;
        if let Some(syms) = self.keysyms.get_mut(at..at + self.per_keycode) {
            syms.fill(0);
            if let Some(s) = syms.get_mut(0..2.min(syms.len())) {
                s.fill(keysym);
            }
        }
    }
}

/// Spare keycodes (none of the keyboard's keys on them) the device puts
/// characters on, kept for the connection's life: a keycode keeps its
/// character while programs may still be reading the keys typed with it
/// (at least [`REUSE_AFTER`] after its last press, so a call's keycodes
/// never change under it unless it types more distinct characters than
/// there are spares), and all are given back once unused for
/// [`GIVE_BACK_AFTER`].
#[derive(Debug, Default)]
pub(super) struct Spares {
    codes: Vec<Spare>,
    last_press: Option<Instant>,
}

/// A spare keycode and what the device put on it.
#[derive(Debug, Clone, Copy)]
struct Spare {
    code: u8,
    /// The keysym on it (0: none).
    keysym: Keysym,
    /// When it was last pressed.
    pressed: Option<Instant>,
}

impl Spares {
    /// Takes the keyboard as it is now: keycodes the device put a keysym on
    /// that no longer hold it were changed by someone else and are no
    /// longer spares; keycodes with no keysym are.
    pub(super) fn meet(&mut self, keyboard: &Keyboard) {
        self.codes.retain(|spare| {
            let syms = keyboard.syms(spare.code);
            if spare.keysym == 0 {
                syms.iter().all(|&s| s == 0)
            } else {
                syms.contains(&spare.keysym) && syms.iter().all(|&s| s == 0 || s == spare.keysym)
            }
        });
        for code in keyboard.spares() {
            if !self.codes.iter().any(|s| s.code == code) {
                self.codes.push(Spare {
                    code,
                    keysym: 0,
                    pressed: None,
                });
            }
        }
    }

    /// Puts on spare keycodes, all at once, the keysyms the keyboard
    /// lacks among the next of `upcoming` (as many different ones as there
    /// are spares), then lets programs read the new mapping ([`SETTLE`])
    /// before any key typed with it arrives. A spare is given a new keysym
    /// only when it holds none of those, empty ones first, then the one
    /// pressed longest ago, once that was [`REUSE_AFTER`] ago. False when
    /// that wait would pass `until`.
    pub(super) fn prepare(
        &mut self,
        conn: &RustConnection,
        keyboard: &mut Keyboard,
        upcoming: &[Keysym],
        until: Instant,
    ) -> Result<bool, XError> {
        let on_spare = |k: Keysym| self.codes.iter().any(|s| s.keysym == k);
        // The keysyms the next keys need on spares, up to as many as there
        // are spares: those there already stay.
        let mut keep: Vec<Keysym> = Vec::new();
        for &k in upcoming {
            if keep.contains(&k) || (keyboard.find(k).is_some() && !on_spare(k)) {
                continue;
            }
            if keep.len() == self.codes.len() {
                break;
            }
            keep.push(k);
        }
        let wanted: Vec<Keysym> = keep.iter().copied().filter(|&k| !on_spare(k)).collect();
        if wanted.is_empty() {
            return Ok(true);
        }
        if self.codes.is_empty() {
            return Err(XError::Failed(
                "the keyboard has no spare keycode to put the characters it lacks on".to_owned(),
            ));
        }
        let mut free: Vec<usize> = (0..self.codes.len())
            .filter(|&i| self.codes.get(i).is_some_and(|s| !keep.contains(&s.keysym)))
            .collect();
        free.sort_by_key(|&i| self.codes.get(i).map(|s| (s.keysym != 0, s.pressed)));
        let per_keycode = keyboard.per_keycode;
        for (&keysym, &at) in wanted.iter().zip(&free) {
            let Some(spare) = self.codes.get_mut(at) else {
                continue;
            };
            if let Some(pressed) = spare.pressed {
                let ready = pressed + REUSE_AFTER;
                if ready > until {
                    return Ok(false);
                }
                let now = Instant::now();
                if ready > now {
                    std::thread::sleep(ready - now);
                }
            }
            let mut syms = vec![0; per_keycode];
            if let Some(s) = syms.get_mut(0..2.min(per_keycode)) {
                s.fill(keysym);
            }
            conn.change_keyboard_mapping(
                1,
                spare.code,
                u8::try_from(per_keycode).unwrap_or(1),
                &syms,
            )?;
            keyboard.set(spare.code, keysym);
            spare.keysym = keysym;
            spare.pressed = None;
        }
        finish(conn)?;
        std::thread::sleep(SETTLE);
        Ok(true)
    }

    /// Notes that `code` was pressed now.
    pub(super) fn pressed(&mut self, code: u8) {
        let now = Instant::now();
        if let Some(spare) = self.codes.iter_mut().find(|s| s.code == code) {
            spare.pressed = Some(now);
        }
        self.last_press = Some(now);
    }

    /// Whether a spare keycode holds a keysym the device put on it.
    pub(super) fn hold_any(&self) -> bool {
        self.codes.iter().any(|s| s.keysym != 0)
    }

    /// How long since a key was typed with a spare keycode; zero while one
    /// holds a keysym that was never pressed (being typed now).
    pub(super) fn idle_for(&self) -> Duration {
        if !self.hold_any() {
            return Duration::ZERO;
        }
        self.last_press.map_or(Duration::MAX, |at| at.elapsed())
    }

    /// Puts every spare keycode back to no keysym.
    pub(super) fn give_back(&mut self, conn: &RustConnection) -> Result<(), XError> {
        let per_keycode = conn
            .get_keyboard_mapping(conn.setup().min_keycode, 1)?
            .reply()?
            .keysyms_per_keycode;
        let none = vec![0; usize::from(per_keycode).max(1)];
        for spare in &mut self.codes {
            if spare.keysym != 0 {
                conn.change_keyboard_mapping(1, spare.code, per_keycode.max(1), &none)?;
                spare.keysym = 0;
                spare.pressed = None;
            }
        }
        finish(conn)
    }
}
