//! Keysyms: which one a key press means under the keyboard mapping and
//! the modifiers held, the text it types, and its name as xdotool spells
//! it.

/// `NoSymbol`.
const NO_SYMBOL: u32 = 0;

/// The modifier bits of a key event's state the core protocol fixes.
const SHIFT: u16 = 0x01;
const LOCK: u16 = 0x02;
const CONTROL: u16 = 0x04;

/// Mod1 to Mod5, in state bit order.
const MOD_BITS: [u16; 5] = [0x08, 0x10, 0x20, 0x40, 0x80];

/// The keysyms of modifier keys: a press of one is no key event of its own.
fn is_modifier(keysym: u32) -> bool {
    // Shift_L .. Hyper_R, ISO_Level2_Latch .. ISO_Level5_Lock,
    // Mode_switch, Num_Lock.
    (0xffe1..=0xffee).contains(&keysym)
        || (0xfe01..=0xfe13).contains(&keysym)
        || keysym == 0xff7e
        || keysym == 0xff7f
}

/// The keyboard as the server maps it: keysyms per keycode and which
/// modifier bits pick the second group and the third level.
#[derive(Debug, Clone, Default)]
pub(crate) struct Keymap {
    pub(crate) min_keycode: u8,
    pub(crate) per_keycode: u8,
    pub(crate) keysyms: Vec<u32>,
    /// The modifier bits of Mode_switch (the second group).
    pub(crate) group_mask: u16,
    /// The modifier bits of ISO_Level3_Shift (the third level).
    pub(crate) level3_mask: u16,
    /// The modifier bits of Mod1 to Mod5 that Alt and Super keys set.
    pub(crate) alt_mask: u16,
    pub(crate) super_mask: u16,
}

impl Keymap {
    /// The keysyms of `keycode`, one per column.
    fn row(&self, keycode: u8) -> &[u32] {
        let per = usize::from(self.per_keycode);
        let Some(index) = keycode.checked_sub(self.min_keycode) else {
            return &[];
        };
        let start = usize::from(index) * per;
        self.keysyms.get(start..start + per).unwrap_or(&[])
    }

    /// The first keysym of `keycode`, whatever the modifiers.
    pub(crate) fn base(&self, keycode: u8) -> u32 {
        self.row(keycode).first().copied().unwrap_or(NO_SYMBOL)
    }

    /// Reads which modifier bits Mode_switch, ISO_Level3_Shift, Alt and
    /// Super set, from the modifier mapping's keycodes (eight rows of
    /// `per_modifier` each: Shift, Lock, Control, Mod1 .. Mod5).
    pub(crate) fn read_modifiers(&mut self, per_modifier: usize, keycodes: &[u8]) {
        let (mut group, mut level3, mut alt, mut super_) = (0, 0, 0, 0);
        for (row, bit) in MOD_BITS.iter().enumerate() {
            let start = (row + 3) * per_modifier;
            let Some(codes) = keycodes.get(start..start + per_modifier) else {
                continue;
            };
            for &code in codes.iter().filter(|&&c| c != 0) {
                for &keysym in self.row(code) {
                    match keysym {
                        0xff7e => group |= bit,
                        0xfe03 => level3 |= bit,
                        0xffe9 | 0xffea => alt |= bit,
                        0xffeb | 0xffec => super_ |= bit,
                        _ => {}
                    }
                }
            }
        }
        self.group_mask = group;
        self.level3_mask = level3;
        self.alt_mask = if alt == 0 { 0x08 } else { alt };
        self.super_mask = if super_ == 0 { 0x40 } else { super_ };
    }

    /// The keysym a press of `keycode` with `state` means, by the core
    /// protocol's rules: the group and level the modifiers pick, Lock and
    /// Shift on letters, a missing column read from the ones before it.
    pub(crate) fn keysym(&self, keycode: u8, state: u16) -> u32 {
        let row = self.row(keycode);
        let at = |i: usize| row.get(i).copied().unwrap_or(NO_SYMBOL);
        if state & self.level3_mask != 0 && self.level3_mask != 0 {
            let shifted = state & SHIFT != 0;
            let keysym = at(if shifted { 5 } else { 4 });
            if keysym != NO_SYMBOL {
                return keysym;
            }
            if shifted && at(4) != NO_SYMBOL {
                return at(4);
            }
        }
        let group = if state & self.group_mask != 0 && self.group_mask != 0 {
            2
        } else {
            0
        };
        let (mut lower, mut upper) = (at(group), at(group + 1));
        if group == 2 && lower == NO_SYMBOL && upper == NO_SYMBOL {
            (lower, upper) = (at(0), at(1));
        }
        if upper == NO_SYMBOL {
            let (low, up) = case_pair(lower);
            (lower, upper) = (low, up);
        }
        let shift = state & SHIFT != 0;
        let lock = state & LOCK != 0;
        let keysym = if shift ^ (lock && case_pair(lower).1 != lower) {
            upper
        } else {
            lower
        };
        if keysym == NO_SYMBOL { lower } else { keysym }
    }

    /// The names of the modifiers `state` holds that make a press a
    /// combination: `ctrl`, `alt`, `super` (and `shift` with them).
    pub(crate) fn combo_modifiers(&self, state: u16) -> Vec<&'static str> {
        let mut names = Vec::new();
        if state & CONTROL != 0 {
            names.push("ctrl");
        }
        if state & self.alt_mask != 0 {
            names.push("alt");
        }
        if state & self.super_mask != 0 {
            names.push("super");
        }
        if !names.is_empty() && state & SHIFT != 0 {
            names.push("shift");
        }
        names
    }
}

/// The lower and upper case of a Latin-1 or Unicode letter keysym; any
/// other keysym is its own case.
fn case_pair(keysym: u32) -> (u32, u32) {
    match keysym {
        0x41..=0x5a => (keysym + 0x20, keysym),
        0x61..=0x7a => (keysym, keysym - 0x20),
        0xc0..=0xde if keysym != 0xd7 => (keysym + 0x20, keysym),
        0xe0..=0xfe if keysym != 0xf7 => (keysym, keysym - 0x20),
        0x100_0000..=0x110_ffff => {
            let Some(c) = char::from_u32(keysym - 0x100_0000) else {
                return (keysym, keysym);
            };
            let lower = single(c.to_lowercase()).unwrap_or(c);
            let upper = single(c.to_uppercase()).unwrap_or(c);
            let (lower, upper) = (u32::from(lower), u32::from(upper));
            (lower + 0x100_0000, upper + 0x100_0000)
        }
        _ => (keysym, keysym),
    }
}

/// The one character of a case mapping, when it is one.
fn single(mut chars: impl Iterator<Item = char>) -> Option<char> {
    let first = chars.next()?;
    chars.next().is_none().then_some(first)
}

/// Whether a press of `keysym` is a modifier key's.
pub(crate) fn is_modifier_key(keysym: u32) -> bool {
    is_modifier(keysym)
}

/// The text a press of `keysym` types: Latin-1 and Unicode keysyms
/// (0x1000000 + code point), Return and Tab; none for the others.
pub(crate) fn text_of(keysym: u32) -> Option<char> {
    match keysym {
        0x20..=0x7e | 0xa0..=0xff => char::from_u32(keysym),
        0x100_0100..=0x110_ffff => char::from_u32(keysym - 0x100_0000),
        0xff0d | 0xff8d => Some('\n'),
        0xff09 => Some('\t'),
        _ => None,
    }
}

/// The named keysyms outside Latin-1, as xdotool spells them.
const NAMES: [(u32, &str); 36] = [
    (0xff08, "BackSpace"),
    (0xff09, "Tab"),
    (0xff0d, "Return"),
    (0xff1b, "Escape"),
    (0xffff, "Delete"),
    (0xff50, "Home"),
    (0xff51, "Left"),
    (0xff52, "Up"),
    (0xff53, "Right"),
    (0xff54, "Down"),
    (0xff55, "Page_Up"),
    (0xff56, "Page_Down"),
    (0xff57, "End"),
    (0xff63, "Insert"),
    (0xff67, "Menu"),
    (0xff8d, "KP_Enter"),
    (0xffbe, "F1"),
    (0xffbf, "F2"),
    (0xffc0, "F3"),
    (0xffc1, "F4"),
    (0xffc2, "F5"),
    (0xffc3, "F6"),
    (0xffc4, "F7"),
    (0xffc5, "F8"),
    (0xffc6, "F9"),
    (0xffc7, "F10"),
    (0xffc8, "F11"),
    (0xffc9, "F12"),
    (0xff13, "Pause"),
    (0xff14, "Scroll_Lock"),
    (0xff61, "Print"),
    (0xff6a, "Help"),
    (0xff6b, "Break"),
    (0xff20, "Multi_key"),
    (0xff7e, "Mode_switch"),
    (0xff7f, "Num_Lock"),
];

/// The name of `keysym` as xdotool takes it: `space`, a printable
/// character itself, `Return`, `F5`; `U+XXXX` for another Unicode keysym
/// and `0x...` for anything else.
pub(crate) fn name_of(keysym: u32) -> String {
    if let Some((_, name)) = NAMES.iter().find(|(k, _)| *k == keysym) {
        return (*name).to_owned();
    }
    match keysym {
        0x20 => "space".to_owned(),
        0x21..=0x7e | 0xa1..=0xff => char::from_u32(keysym).map_or_else(String::new, String::from),
        0x100_0100..=0x110_ffff => format!("U+{:04X}", keysym - 0x100_0000),
        _ => format!("0x{keysym:x}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small keyboard: `a`/`A` on 10, `1`/`!` on 11, Return on 12, a
    /// Unicode check mark on 13, `e` with é on the third level on 14,
    /// Alt_L on 15 (Mod1) and ISO_Level3_Shift on 16 (Mod5).
    fn keymap() -> Keymap {
        let mut map = Keymap {
            min_keycode: 10,
            per_keycode: 6,
            keysyms: vec![
                0x61, 0x41, 0, 0, 0, 0, //
                0x31, 0x21, 0, 0, 0, 0, //
                0xff0d, 0, 0, 0, 0, 0, //
                0x100_2713, 0, 0, 0, 0, 0, //
                0x65, 0x45, 0, 0, 0xe9, 0xc9, //
                0xffe9, 0, 0, 0, 0, 0, //
                0xfe03, 0, 0, 0, 0, 0, //
            ],
            ..Keymap::default()
        };
        let mut modifiers = vec![0u8; 8];
        modifiers[3] = 15;
        modifiers[7] = 16;
        map.read_modifiers(1, &modifiers);
        map
    }

    #[test]
    fn keysyms_follow_shift_lock_and_the_third_level() {
        let map = keymap();
        assert_eq!((map.alt_mask, map.level3_mask), (0x08, 0x80));
        let cases: [(u8, u16, u32); 10] = [
            (10, 0, 0x61),
            (10, SHIFT, 0x41),
            (10, LOCK, 0x41),
            (10, LOCK | SHIFT, 0x61),
            (11, LOCK, 0x31),
            (11, SHIFT, 0x21),
            (12, SHIFT, 0xff0d),
            (13, 0, 0x100_2713),
            (14, 0x80, 0xe9),
            (14, 0x80 | SHIFT, 0xc9),
        ];
        for (keycode, state, expected) in cases {
            assert_eq!(map.keysym(keycode, state), expected, "{keycode} {state:#x}");
        }
        assert_eq!(map.keysym(99, 0), NO_SYMBOL);
        assert_eq!(map.combo_modifiers(CONTROL | SHIFT), ["ctrl", "shift"]);
        assert_eq!(map.combo_modifiers(SHIFT), Vec::<&str>::new());
        assert_eq!(map.combo_modifiers(0x08), ["alt"]);
    }

    #[test]
    fn text_and_names() {
        assert_eq!(text_of(0x61), Some('a'));
        assert_eq!(text_of(0xe9), Some('é'));
        assert_eq!(text_of(0x100_65e5), Some('日'));
        assert_eq!(text_of(0xff0d), Some('\n'));
        assert_eq!(text_of(0xff09), Some('\t'));
        assert_eq!(text_of(0xffe1), None);
        assert_eq!(name_of(0x73), "s");
        assert_eq!(name_of(0x20), "space");
        assert_eq!(name_of(0xff0d), "Return");
        assert_eq!(name_of(0x100_2713), "U+2713");
        assert!(is_modifier_key(0xffe3) && !is_modifier_key(0x73));
        assert_eq!(case_pair(0x100_00e9 + 0x100), (0x100_01e9, 0x100_01e8));
    }
}
