//! Key names in xdotool's vocabulary (`ctrl+s`, `Return`, `alt+Tab`) read
//! into X keysyms, and the keysym of any character. Everything here is
//! checked before a key is pressed: a name not in the table refuses the
//! whole call. The keysyms reachable are exactly the table's, `F1`-`F24`
//! and those of characters (Latin-1's own, others' Unicode keysyms): no
//! keysym by number, so none of those the X keyboard extension binds to
//! the server's own actions (`XF86Switch_VT_1`, `Terminate_Server`,
//! `Pointer_Button1`).

/// Most combinations one `key` call presses.
pub const MAX_COMBOS: usize = 16;

/// An X keysym.
pub type Keysym = u32;

/// Keysyms of the modifiers.
pub mod sym {
    use crate::keys::Keysym;
    /// Shift_L.
    pub const SHIFT: Keysym = 0xffe1;
    /// Control_L.
    pub const CONTROL: Keysym = 0xffe3;
    /// Alt_L.
    pub const ALT: Keysym = 0xffe9;
    /// Super_L.
    pub const SUPER: Keysym = 0xffeb;
    /// Return.
    pub const RETURN: Keysym = 0xff0d;
    /// Tab.
    pub const TAB: Keysym = 0xff09;
}

/// Modifier names (lower case) and their keysyms.
const MODIFIERS: &[(&str, Keysym)] = &[
    ("ctrl", sym::CONTROL),
    ("control", sym::CONTROL),
    ("control_l", sym::CONTROL),
    ("control_r", 0xffe4),
    ("shift", sym::SHIFT),
    ("shift_l", sym::SHIFT),
    ("shift_r", 0xffe2),
    ("alt", sym::ALT),
    ("alt_l", sym::ALT),
    ("alt_r", 0xffea),
    ("altgr", 0xfe03),
    ("iso_level3_shift", 0xfe03),
    ("super", sym::SUPER),
    ("super_l", sym::SUPER),
    ("super_r", 0xffec),
    ("meta", sym::SUPER),
    ("cmd", sym::SUPER),
    ("win", sym::SUPER),
];

/// Named keys (compared case-insensitively) and their keysyms.
const NAMES: &[(&str, Keysym)] = &[
    ("return", sym::RETURN),
    ("enter", sym::RETURN),
    ("kp_enter", 0xff8d),
    ("tab", sym::TAB),
    ("iso_left_tab", 0xfe20),
    ("escape", 0xff1b),
    ("esc", 0xff1b),
    ("backspace", 0xff08),
    ("delete", 0xffff),
    ("del", 0xffff),
    ("insert", 0xff63),
    ("home", 0xff50),
    ("end", 0xff57),
    ("page_up", 0xff55),
    ("pageup", 0xff55),
    ("prior", 0xff55),
    ("page_down", 0xff56),
    ("pagedown", 0xff56),
    ("next", 0xff56),
    ("left", 0xff51),
    ("up", 0xff52),
    ("right", 0xff53),
    ("down", 0xff54),
    ("space", 0x20),
    ("menu", 0xff67),
    ("print", 0xff61),
    ("pause", 0xff13),
    ("break", 0xff6b),
    ("scroll_lock", 0xff14),
    ("caps_lock", 0xffe5),
    ("num_lock", 0xff7f),
    ("sys_req", 0xff15),
    ("exclam", 0x21),
    ("quotedbl", 0x22),
    ("numbersign", 0x23),
    ("dollar", 0x24),
    ("percent", 0x25),
    ("ampersand", 0x26),
    ("apostrophe", 0x27),
    ("quoteright", 0x27),
    ("parenleft", 0x28),
    ("parenright", 0x29),
    ("asterisk", 0x2a),
    ("plus", 0x2b),
    ("comma", 0x2c),
    ("minus", 0x2d),
    ("period", 0x2e),
    ("slash", 0x2f),
    ("colon", 0x3a),
    ("semicolon", 0x3b),
    ("less", 0x3c),
    ("equal", 0x3d),
    ("greater", 0x3e),
    ("question", 0x3f),
    ("at", 0x40),
    ("bracketleft", 0x5b),
    ("backslash", 0x5c),
    ("bracketright", 0x5d),
    ("asciicircum", 0x5e),
    ("underscore", 0x5f),
    ("grave", 0x60),
    ("quoteleft", 0x60),
    ("braceleft", 0x7b),
    ("bar", 0x7c),
    ("braceright", 0x7d),
    ("asciitilde", 0x7e),
    ("kp_0", 0xffb0),
    ("kp_1", 0xffb1),
    ("kp_2", 0xffb2),
    ("kp_3", 0xffb3),
    ("kp_4", 0xffb4),
    ("kp_5", 0xffb5),
    ("kp_6", 0xffb6),
    ("kp_7", 0xffb7),
    ("kp_8", 0xffb8),
    ("kp_9", 0xffb9),
    ("kp_add", 0xffab),
    ("kp_subtract", 0xffad),
    ("kp_multiply", 0xffaa),
    ("kp_divide", 0xffaf),
    ("kp_decimal", 0xffae),
    ("xf86audioraisevolume", 0x1008_ff13),
    ("xf86audiolowervolume", 0x1008_ff11),
    ("xf86audiomute", 0x1008_ff12),
    ("xf86audioplay", 0x1008_ff14),
    ("xf86audiostop", 0x1008_ff15),
    ("xf86audioprev", 0x1008_ff16),
    ("xf86audionext", 0x1008_ff17),
    ("xf86monbrightnessup", 0x1008_ff02),
    ("xf86monbrightnessdown", 0x1008_ff03),
];

/// Why a key combination was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// A name that is neither a key nor a modifier.
    #[error("\"{0}\" is not a key name")]
    Unknown(String),
    /// Nothing to press.
    #[error("no key given")]
    Empty,
    /// More than [`MAX_COMBOS`] combinations.
    #[error("at most 16 key combinations at once, {0} given")]
    TooMany(usize),
    /// A character that cannot be typed.
    #[error("the text holds U+{0:04X}, a control character that cannot be typed")]
    Control(u32),
}

/// One combination: modifiers held (in order) while the key is pressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Combo {
    /// The modifiers' keysyms.
    pub modifiers: Vec<Keysym>,
    /// The key's keysym.
    pub key: Keysym,
}

/// The keysym of a modifier name (`ctrl`, `shift`, `alt`, `super`, ...).
pub fn modifier(name: &str) -> Option<Keysym> {
    let name = name.to_ascii_lowercase();
    MODIFIERS.iter().find(|(n, _)| *n == name).map(|&(_, k)| k)
}

/// The keysym of a key name: a named key, a modifier, `F1`-`F24`, or a
/// single character.
pub fn key(name: &str) -> Option<Keysym> {
    let mut chars = name.chars();
    if let (Some(c), None) = (chars.next(), chars.next()) {
        return char_keysym(c);
    }
    let lower = name.to_ascii_lowercase();
    if let Some(&(_, k)) = NAMES.iter().find(|(n, _)| *n == lower) {
        return Some(k);
    }
    if let Some(k) = modifier(&lower) {
        return Some(k);
    }
    if let Some(n) = lower.strip_prefix('f').and_then(|n| n.parse::<u32>().ok())
        && (1..=24).contains(&n)
        && !lower.starts_with("f0")
    {
        return Some(0xffbe + n - 1);
    }
    None
}

/// The keysym that types `c`: Latin-1 as itself, `\n` Return, `\t` Tab,
/// any other character `0x1000000` plus its code point. Other control
/// characters have none (the vessel refuses them too).
pub fn char_keysym(c: char) -> Option<Keysym> {
    let cp = u32::from(c);
    match c {
        '\n' => Some(sym::RETURN),
        '\t' => Some(sym::TAB),
        _ if c.is_control() => None,
        _ if (0x20..=0x7e).contains(&cp) || (0xa0..=0xff).contains(&cp) => Some(cp),
        _ => Some(0x0100_0000 + cp),
    }
}

/// The keysyms that type `text`, in order.
pub fn text_keysyms(text: &str) -> Result<Vec<Keysym>, KeyError> {
    text.chars()
        .map(|c| char_keysym(c).ok_or(KeyError::Control(u32::from(c))))
        .collect()
}

/// Reads `ctrl+s`, `Return`, `alt+Tab`, or up to [`MAX_COMBOS`] of them
/// separated by spaces.
pub fn combos(text: &str) -> Result<Vec<Combo>, KeyError> {
    let words: Vec<&str> = text.split_whitespace().collect();
    if words.is_empty() {
        return Err(KeyError::Empty);
    }
    if words.len() > MAX_COMBOS {
        return Err(KeyError::TooMany(words.len()));
    }
    words.into_iter().map(combo).collect()
}

fn combo(word: &str) -> Result<Combo, KeyError> {
    // `+` alone, or a combination ending in `++`, presses the plus key.
    let (head, last) = if word == "+" {
        ("", "+")
    } else if let Some(head) = word.strip_suffix("++") {
        (head, "+")
    } else {
        match word.rsplit_once('+') {
            Some((head, last)) => (head, last),
            None => ("", word),
        }
    };
    let mut modifiers = Vec::new();
    if !head.is_empty() {
        for name in head.split('+') {
            modifiers.push(modifier(name).ok_or_else(|| KeyError::Unknown(name.to_owned()))?);
        }
    }
    let key = key(last).ok_or_else(|| KeyError::Unknown(last.to_owned()))?;
    Ok(Combo { modifiers, key })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(text: &str, expected: Result<Vec<(Vec<Keysym>, Keysym)>, &str>) {
        let got = combos(text)
            .map(|cs| cs.into_iter().map(|c| (c.modifiers, c.key)).collect())
            .map_err(|e| e.to_string());
        assert_eq!(got, expected.map_err(str::to_owned), "{text}");
    }

    #[test]
    fn combinations_read_in_xdotool_vocabulary() {
        check("ctrl+s", Ok(vec![(vec![sym::CONTROL], 0x73)]));
        check("Return", Ok(vec![(vec![], sym::RETURN)]));
        check("alt+Tab", Ok(vec![(vec![sym::ALT], sym::TAB)]));
        check(
            "ctrl+shift+T super+l",
            Ok(vec![
                (vec![sym::CONTROL, sym::SHIFT], 0x54),
                (vec![sym::SUPER], 0x6c),
            ]),
        );
        check("F5 F24", Ok(vec![(vec![], 0xffc2), (vec![], 0xffd5)]));
        check("ctrl++", Ok(vec![(vec![sym::CONTROL], 0x2b)]));
        check("ctrl+plus", Ok(vec![(vec![sym::CONTROL], 0x2b)]));
        check("é", Ok(vec![(vec![], 0xe9)]));
        check("€", Ok(vec![(vec![], 0x0100_20ac)]));
        check("Hyperspace", Err("\"Hyperspace\" is not a key name"));
        for number in [
            "0x1008fe01",
            "0xfed5",
            "0xff0d",
            "XF86Switch_VT_1",
            "Pointer_Button1",
        ] {
            check(number, Err(&format!("\"{number}\" is not a key name")));
        }
        check("hyper+a", Err("\"hyper\" is not a key name"));
        check("F25", Err("\"F25\" is not a key name"));
        check("ctrl+", Err("\"\" is not a key name"));
        check("", Err("no key given"));
        check(
            &"a ".repeat(17),
            Err("at most 16 key combinations at once, 17 given"),
        );
    }

    #[test]
    fn text_becomes_keysyms() {
        assert_eq!(
            text_keysyms("a\nb\tç😀"),
            Ok(vec![0x61, sym::RETURN, 0x62, sym::TAB, 0xe7, 0x0101_f600])
        );
        assert_eq!(text_keysyms("a\u{7}"), Err(KeyError::Control(7)));
        assert_eq!(text_keysyms("a\r\n"), Err(KeyError::Control(13)));
    }
}
