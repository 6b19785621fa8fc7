//! Input through XTest: the pointer moved, clicks, drags, the wheel and
//! key combinations, whatever an action pressed released even when it
//! failed, keys pressed only after checking where they go.

use std::time::{Duration, Instant};

use x11rb::protocol::xproto::{
    BUTTON_PRESS_EVENT, ConnectionExt as _, KEY_PRESS_EVENT, MOTION_NOTIFY_EVENT,
};
use x11rb::protocol::xtest::ConnectionExt as _;

use super::keyboard::{GIVE_BACK_AFTER, Keyboard, no_key};
use super::link::{XError, finish};
use super::session::Session;
use super::windows::{Blacked, KeysGo};
use crate::config::Blackout;
use crate::keys::{Combo, Keysym, sym};

/// How long the window tree read for keys is trusted: a call that types
/// longer reads it again.
const TREE_FRESH: Duration = Duration::from_millis(250);
/// Motions between the press and the release of a drag.
pub const DRAG_STEPS: i32 = 8;
/// The pause between the motions of a drag.
const DRAG_PAUSE: Duration = Duration::from_millis(5);
/// Slack beyond a call's time given to reading the tree for its last keys.
const GRAB_SLACK: Duration = Duration::from_millis(500);

/// How a run of key combinations ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pressed {
    /// All of them were pressed.
    All,
    /// The first `done` were pressed, then the rest were refused: `why`.
    Stopped {
        /// How many were pressed.
        done: usize,
        /// Why the next one was not.
        why: &'static str,
    },
    /// The first `done` were pressed before the call's time ran out.
    OutOfTime {
        /// How many were pressed.
        done: usize,
    },
}

/// Buttons and keys pressed by an action and not yet released.
#[derive(Default)]
struct Held {
    buttons: Vec<u8>,
    keys: Vec<u8>,
}

impl Session {
    /// Where the pointer is, in screen pixels.
    pub fn pointer(&self) -> Result<(i64, i64), XError> {
        let reply = self.conn.query_pointer(self.root)?.reply()?;
        Ok((i64::from(reply.root_x), i64::from(reply.root_y)))
    }

    fn fake(&self, kind: u8, detail: u8, x: i64, y: i64) -> Result<(), XError> {
        let clamp = |v: i64| v.clamp(0, i64::from(i16::MAX)) as i16;
        self.conn
            .xtest_fake_input(kind, detail, 0, self.root, clamp(x), clamp(y), 0)?;
        Ok(())
    }

    /// Moves the pointer to the screen pixel (`x`, `y`).
    pub fn move_to(&self, x: i64, y: i64) -> Result<(), XError> {
        self.fake(MOTION_NOTIFY_EVENT, 0, x, y)?;
        self.finish()
    }

    /// Waits until the server has done every request sent.
    fn finish(&self) -> Result<(), XError> {
        finish(&self.conn)
    }

    /// Runs `act` with the keys and buttons it presses recorded, and
    /// releases whatever it left pressed, even when it failed.
    fn holding(&self, act: impl FnOnce(&mut Held) -> Result<(), XError>) -> Result<(), XError> {
        let mut held = Held::default();
        let result = act(&mut held);
        for &button in held.buttons.iter().rev() {
            let _ = self.fake(BUTTON_PRESS_EVENT + 1, button, 0, 0);
        }
        for &key in held.keys.iter().rev() {
            let _ = self.fake(KEY_PRESS_EVENT + 1, key, 0, 0);
        }
        result?;
        self.finish()
    }

    fn press_button(&self, held: &mut Held, button: u8) -> Result<(), XError> {
        self.fake(BUTTON_PRESS_EVENT, button, 0, 0)?;
        held.buttons.push(button);
        Ok(())
    }

    fn release_button(&self, held: &mut Held, button: u8) -> Result<(), XError> {
        if let Some(at) = held.buttons.iter().rposition(|&b| b == button) {
            held.buttons.remove(at);
        }
        self.fake(BUTTON_PRESS_EVENT + 1, button, 0, 0)
    }

    fn press_key(&self, held: &mut Held, keycode: u8) -> Result<(), XError> {
        self.fake(KEY_PRESS_EVENT, keycode, 0, 0)?;
        held.keys.push(keycode);
        Ok(())
    }

    fn release_key(&self, held: &mut Held, keycode: u8) -> Result<(), XError> {
        if let Some(at) = held.keys.iter().rposition(|&k| k == keycode) {
            held.keys.remove(at);
        }
        self.fake(KEY_PRESS_EVENT + 1, keycode, 0, 0)
    }

    /// Clicks `button` `count` times at (`x`, `y`) (or where the pointer
    /// is), holding the `modifiers` keysyms meanwhile.
    pub fn click(
        &self,
        at: Option<(i64, i64)>,
        button: u8,
        count: u8,
        modifiers: &[Keysym],
    ) -> Result<(), XError> {
        let keyboard = if modifiers.is_empty() {
            None
        } else {
            Some(Keyboard::read(&self.conn)?)
        };
        let codes = modifiers
            .iter()
            .map(|&m| {
                keyboard
                    .as_ref()
                    .and_then(|k| k.find(m))
                    .map(|(code, _)| code)
                    .ok_or_else(|| no_key(m))
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.holding(|held| {
            if let Some((x, y)) = at {
                self.fake(MOTION_NOTIFY_EVENT, 0, x, y)?;
            }
            for &code in &codes {
                self.press_key(held, code)?;
            }
            for _ in 0..count {
                self.press_button(held, button)?;
                self.release_button(held, button)?;
            }
            for &code in codes.iter().rev() {
                self.release_key(held, code)?;
            }
            Ok(())
        })
    }

    /// Presses the left button at `from`, moves in steps to `to`, releases
    /// there. `may_press` runs with the server grabbed before the pointer
    /// goes to `from` and presses, `may_release` likewise before the
    /// pointer reaches `to` and releases; when the second refuses, the
    /// button is released back at `from`. The steps between run without
    /// the grab, so that programs follow the drag as it happens.
    pub fn drag(
        &self,
        from: (i64, i64),
        to: (i64, i64),
        may_press: impl FnOnce() -> Result<Result<(), String>, XError>,
        may_release: impl FnOnce() -> Result<Result<(), String>, XError>,
    ) -> Result<Result<(), String>, XError> {
        let mut outcome = Ok(());
        self.holding(|held| {
            let pressed = self.grabbed(|| {
                if let Err(why) = may_press()? {
                    return Ok(Err(why));
                }
                self.fake(MOTION_NOTIFY_EVENT, 0, from.0, from.1)?;
                self.press_button(held, 1)?;
                Ok(Ok(()))
            })?;
            if let Err(why) = pressed {
                outcome = Err(why);
                return Ok(());
            }
            self.finish()?;
            for step in 1..DRAG_STEPS {
                let along = |a: i64, b: i64| a + (b - a) * i64::from(step) / i64::from(DRAG_STEPS);
                self.fake(
                    MOTION_NOTIFY_EVENT,
                    0,
                    along(from.0, to.0),
                    along(from.1, to.1),
                )?;
                self.finish()?;
                std::thread::sleep(DRAG_PAUSE);
            }
            self.grabbed(|| {
                let end = match may_release()? {
                    Ok(()) => to,
                    Err(why) => {
                        outcome = Err(why);
                        from
                    }
                };
                self.fake(MOTION_NOTIFY_EVENT, 0, end.0, end.1)?;
                self.release_button(held, 1)
            })
        })?;
        Ok(outcome)
    }

    /// Turns the wheel: `button` 4 up, 5 down, 6 left, 7 right, `clicks`
    /// times, at (`x`, `y`) or where the pointer is.
    pub fn scroll(&self, at: Option<(i64, i64)>, button: u8, clicks: u8) -> Result<(), XError> {
        self.holding(|held| {
            if let Some((x, y)) = at {
                self.fake(MOTION_NOTIFY_EVENT, 0, x, y)?;
            }
            for _ in 0..clicks {
                self.press_button(held, button)?;
                self.release_button(held, button)?;
            }
            Ok(())
        })
    }

    /// Presses each combination in turn: its modifiers, then its key, then
    /// all released in reverse. Each runs with the server grabbed, after
    /// checking where its keys go ([`Session::keys_go`], the window tree
    /// read again when older than [`TREE_FRESH`] or when the keys' window
    /// changed): nothing can move the focus or the pointer between the
    /// check and the keys. Keys the keyboard lacks are put on spare
    /// keycodes ([`Spares`](super::keyboard::Spares)). Stops at the first combination refused, or
    /// once `until` passed.
    pub fn press_combos(
        &self,
        combos: &[Combo],
        blackout: &Blackout,
        until: Instant,
    ) -> Result<Pressed, XError> {
        let mut keyboard = Keyboard::read(&self.conn)?;
        let mut spares = self.spares.borrow_mut();
        spares.meet(&keyboard);
        let mut blacked: Option<Blacked> = None;
        let mut window = None;
        let mut outcome = Pressed::All;
        let result = self.holding(|held| {
            for (done, combo) in combos.iter().enumerate() {
                if Instant::now() > until {
                    outcome = Pressed::OutOfTime { done };
                    return Ok(());
                }
                let modifiers = combo
                    .modifiers
                    .iter()
                    .map(|&m| {
                        keyboard
                            .find(m)
                            .map(|(code, _)| code)
                            .ok_or_else(|| no_key(m))
                    })
                    .collect::<Result<Vec<u8>, XError>>()?;
                if keyboard.find(combo.key).is_none() {
                    let upcoming: Vec<Keysym> = combos
                        .get(done..)
                        .unwrap_or(&[])
                        .iter()
                        .map(|c| c.key)
                        .collect();
                    if !spares.prepare(&self.conn, &mut keyboard, &upcoming, until)? {
                        outcome = Pressed::OutOfTime { done };
                        return Ok(());
                    }
                }
                let (code, level) = keyboard.find(combo.key).ok_or_else(|| no_key(combo.key))?;
                let shift = if level == 1 && !combo.modifiers.contains(&sym::SHIFT) {
                    Some(
                        keyboard
                            .find(sym::SHIFT)
                            .ok_or_else(|| no_key(sym::SHIFT))?
                            .0,
                    )
                } else {
                    None
                };
                let refused = self.grabbed(|| {
                    let mut goes = None;
                    for fresh in [false, true] {
                        let stale = blacked
                            .as_ref()
                            .is_none_or(|b| b.read_at.elapsed() > TREE_FRESH);
                        if fresh || stale {
                            blacked = Some(self.blacked(blackout, until + GRAB_SLACK)?);
                        }
                        let Some(tree) = &blacked else { continue };
                        let now = self.keys_go(tree)?;
                        goes = Some(now);
                        // The same window as the last combination, checked
                        // on a tree read since: no need to read it again.
                        if fresh || stale || matches!(now, KeysGo::To(w) if Some(w) == window) {
                            break;
                        }
                    }
                    let goes = goes.unwrap_or(KeysGo::Unknown);
                    if let Some(why) = goes.refusal() {
                        return Ok(Some(why));
                    }
                    if let KeysGo::To(w) = goes {
                        window = Some(w);
                    }
                    let mut pressed = Vec::with_capacity(modifiers.len() + 1);
                    for &m in modifiers.iter().chain(&shift) {
                        self.press_key(held, m)?;
                        pressed.push(m);
                    }
                    self.press_key(held, code)?;
                    self.release_key(held, code)?;
                    for m in pressed.into_iter().rev() {
                        self.release_key(held, m)?;
                    }
                    Ok(None)
                })?;
                if let Some(why) = refused {
                    outcome = Pressed::Stopped { done, why };
                    return Ok(());
                }
                spares.pressed(code);
            }
            Ok(())
        });
        result.map(|()| outcome)
    }

    /// Gives the spare keycodes back (no keysym on them) once no key was
    /// typed with them for [`GIVE_BACK_AFTER`], or now when `now`.
    pub fn give_back_spares(&self, now: bool) -> Result<(), XError> {
        let mut spares = self.spares.borrow_mut();
        if !spares.hold_any() || (!now && spares.idle_for() < GIVE_BACK_AFTER) {
            return Ok(());
        }
        spares.give_back(&self.conn)
    }
}
