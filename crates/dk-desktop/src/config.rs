//! The desktop device's settings: the display, the screenshot size, the
//! device's id and name, and what is blacked out. They come from the command
//! line or from a TOML file read fail-closed (unknown keys or a bad value
//! refuse the whole file):
//!
//! ```toml
//! display = ":1"
//! size = "1280x800"
//! id = "desktop"
//! name = "Desktop"
//! root_clicks = false
//!
//! [blackout]
//! classes = ["KeePassXC"]
//! titles = ["*Password*"]
//! regions = ["0,0,200,100"]
//! ```

use std::fmt;
use std::str::FromStr;

use serde::Deserialize;

/// The screenshot size used when none is given.
pub const DEFAULT_SIZE: Size = Size {
    width: 1280,
    height: 800,
};
/// The device id used when none is given.
pub const DEFAULT_ID: &str = "desktop";
/// The device name used when none is given.
pub const DEFAULT_NAME: &str = "Desktop";
/// Smallest side of a screenshot size, in pixels.
pub const MIN_SIDE: u32 = 16;
/// Largest side of a screenshot size, in pixels.
pub const MAX_SIDE: u32 = 8192;
/// Largest configuration text read, in bytes.
pub const MAX_CONFIG_BYTES: usize = 64 * 1024;

/// Why a setting or the configuration file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A size that is not `WxH` with each side from 16 to 8192 pixels.
    #[error("size `{0}` is not WxH with each side from 16 to 8192 pixels (e.g. 1280x800)")]
    Size(String),
    /// A region that is not `X,Y,W,H` with a positive width and height.
    #[error(
        "region `{0}` is not X,Y,W,H in screen pixels with a positive width and height (e.g. 0,0,200,100)"
    )]
    Region(String),
    /// A blank window class or title pattern, or one with a control
    /// character.
    #[error("blackout {what} `{value}` is blank or holds a control character")]
    Pattern {
        /// `class` or `title`.
        what: &'static str,
        /// The value given, control characters escaped.
        value: String,
    },
    /// A display name that is blank or not `:N` / `host:N(.S)`.
    #[error("display `{0}` is not an X display name such as :1")]
    Display(String),
    /// The file is larger than [`MAX_CONFIG_BYTES`].
    #[error("the configuration is larger than {MAX_CONFIG_BYTES} bytes")]
    TooLarge,
    /// The TOML did not read (an unknown key, a wrong type), with the
    /// parser's words.
    #[error("the configuration does not read: {0}")]
    Toml(String),
}

/// The size screenshots are scaled down to fit, keeping the aspect ratio.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
}

impl FromStr for Size {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Self, ConfigError> {
        let bad = || ConfigError::Size(escape(text));
        let (w, h) = text.trim().split_once(['x', 'X']).ok_or_else(bad)?;
        let width: u32 = w.trim().parse().map_err(|_| bad())?;
        let height: u32 = h.trim().parse().map_err(|_| bad())?;
        let side = MIN_SIDE..=MAX_SIDE;
        if side.contains(&width) && side.contains(&height) {
            Ok(Size { width, height })
        } else {
            Err(bad())
        }
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.width, self.height)
    }
}

/// A rectangle of the screen, in screen pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// Left edge.
    pub x: i32,
    /// Top edge.
    pub y: i32,
    /// Width, at least 1.
    pub width: u32,
    /// Height, at least 1.
    pub height: u32,
}

impl Region {
    /// True when the screen pixel (`x`, `y`) is inside.
    pub fn contains(&self, x: i64, y: i64) -> bool {
        let (left, top) = (i64::from(self.x), i64::from(self.y));
        x >= left
            && y >= top
            && x < left + i64::from(self.width)
            && y < top + i64::from(self.height)
    }
}

impl FromStr for Region {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Self, ConfigError> {
        let bad = || ConfigError::Region(escape(text));
        let parts: Vec<&str> = text.split(',').map(str::trim).collect();
        let [x, y, w, h] = parts.as_slice() else {
            return Err(bad());
        };
        let region = Region {
            x: x.parse().map_err(|_| bad())?,
            y: y.parse().map_err(|_| bad())?,
            width: w.parse().map_err(|_| bad())?,
            height: h.parse().map_err(|_| bad())?,
        };
        if region.width == 0
            || region.height == 0
            || i64::from(region.width) > i64::from(u16::MAX) * 2
            || i64::from(region.height) > i64::from(u16::MAX) * 2
        {
            return Err(bad());
        }
        Ok(region)
    }
}

impl fmt::Display for Region {
    /// As the pairing prompt shows it: `X,Y WxH`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{} {}x{}", self.x, self.y, self.width, self.height)
    }
}

/// What is blacked out before any pixel leaves the device, and where the
/// pointer and the keyboard may not act.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Blackout {
    classes: Vec<String>,
    titles: Vec<String>,
    regions: Vec<Region>,
}

impl Blackout {
    /// Nothing blacked out.
    pub fn new() -> Self {
        Blackout::default()
    }

    /// Adds windows whose WM_CLASS instance or class is `class`
    /// (case-insensitive, exact).
    pub fn class(mut self, class: &str) -> Result<Self, ConfigError> {
        self.classes.push(pattern("class", class)?);
        Ok(self)
    }

    /// Adds windows whose title (WM_NAME or _NET_WM_NAME) matches `glob`
    /// (`*` any run of characters, `?` one; case-insensitive).
    pub fn title(mut self, glob: &str) -> Result<Self, ConfigError> {
        self.titles.push(pattern("title", glob)?);
        Ok(self)
    }

    /// Adds a region of the screen.
    pub fn region(mut self, region: Region) -> Self {
        self.regions.push(region);
        self
    }

    /// The window classes.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// The title patterns.
    pub fn titles(&self) -> &[String] {
        &self.titles
    }

    /// The regions.
    pub fn regions(&self) -> &[Region] {
        &self.regions
    }

    /// True when nothing is blacked out.
    pub fn is_empty(&self) -> bool {
        self.classes.is_empty() && self.titles.is_empty() && self.regions.is_empty()
    }

    /// True when a window called `names` is blacked out: its WM_CLASS
    /// (instance or class) is listed, or a title matches a pattern. Fail
    /// closed: a class that could not be read whole counts as every listed
    /// class, and a title that could not counts as matching every pattern.
    pub(crate) fn matches_window(&self, names: &WindowNames) -> bool {
        (names.class_unread && !self.classes.is_empty())
            || (names.title_unread && !self.titles.is_empty())
            || names
                .class
                .iter()
                .any(|c| self.classes.iter().any(|b| lower(b) == lower(c)))
            || names
                .titles
                .iter()
                .any(|t| self.titles.iter().any(|glob| glob_matches(glob, t)))
    }

    /// The sentence the pairing prompt shows: `Blacked out before any pixel
    /// leaves the device: windows of class KeePassXC; windows titled
    /// *Password*; screen region 0,0 200x100.`
    pub fn describe(&self) -> String {
        if self.is_empty() {
            return "Nothing is blacked out.".to_owned();
        }
        let items: Vec<String> = self
            .classes
            .iter()
            .map(|c| format!("windows of class {c}"))
            .chain(self.titles.iter().map(|t| format!("windows titled {t}")))
            .chain(self.regions.iter().map(|r| format!("screen region {r}")))
            .collect();
        format!(
            "Blacked out before any pixel leaves the device: {}.",
            items.join("; ")
        )
    }
}

/// What a window is called, as far as it could be read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct WindowNames {
    /// WM_CLASS: its instance and class names.
    pub class: Vec<String>,
    /// WM_NAME and _NET_WM_NAME.
    pub titles: Vec<String>,
    /// WM_CLASS is longer than the device reads, or not text.
    pub class_unread: bool,
    /// A title is longer than the device reads, or not text in its
    /// declared encoding.
    pub title_unread: bool,
}

/// Every setting of the desktop device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesktopConfig {
    /// The X display (`:1`); `None` leaves it to `DISPLAY`.
    pub display: Option<String>,
    /// The size screenshots fit.
    pub size: Size,
    /// The device id.
    pub id: String,
    /// The device name the person sees.
    pub name: String,
    /// What is blacked out.
    pub blackout: Blackout,
    /// Whether clicks, scrolls and drags may start on the bare desktop
    /// (the root window), where window managers open their menus (some
    /// list every window's title); off unless the person turns it on.
    pub root_clicks: bool,
}

impl Default for DesktopConfig {
    fn default() -> Self {
        DesktopConfig {
            display: None,
            size: DEFAULT_SIZE,
            id: DEFAULT_ID.to_owned(),
            name: DEFAULT_NAME.to_owned(),
            blackout: Blackout::default(),
            root_clicks: false,
        }
    }
}

/// The file's shape, each key spelt once.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    display: Option<String>,
    size: Option<String>,
    id: Option<String>,
    name: Option<String>,
    root_clicks: Option<bool>,
    #[serde(default)]
    blackout: RawBlackout,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawBlackout {
    #[serde(default)]
    classes: Vec<String>,
    #[serde(default)]
    titles: Vec<String>,
    #[serde(default)]
    regions: Vec<String>,
}

impl DesktopConfig {
    /// Reads the TOML text of `--config`; any error refuses the whole file.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        if text.len() > MAX_CONFIG_BYTES {
            return Err(ConfigError::TooLarge);
        }
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let message = e.message().trim().replace('\n', " ");
            ConfigError::Toml(match e.span() {
                Some(span) => {
                    let before = text.get(..span.start).unwrap_or("");
                    let line = before.matches('\n').count() + 1;
                    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
                    format!("line {line}, column {column}: {message}")
                }
                None => message,
            })
        })?;
        let mut config = DesktopConfig::default();
        if let Some(display) = raw.display {
            config.display = Some(check_display(&display)?);
        }
        if let Some(size) = raw.size {
            config.size = size.parse()?;
        }
        if let Some(id) = raw.id {
            config.id = id;
        }
        if let Some(name) = raw.name {
            config.name = name;
        }
        config.root_clicks = raw.root_clicks.unwrap_or(false);
        let mut blackout = Blackout::new();
        for class in &raw.blackout.classes {
            blackout = blackout.class(class)?;
        }
        for title in &raw.blackout.titles {
            blackout = blackout.title(title)?;
        }
        for region in &raw.blackout.regions {
            blackout = blackout.region(region.parse()?);
        }
        config.blackout = blackout;
        Ok(config)
    }
}

/// Checks an X display name: `:N`, `:N.S`, `host:N` (no blank, no control
/// character, a number after the last colon).
pub fn check_display(display: &str) -> Result<String, ConfigError> {
    let bad = || ConfigError::Display(escape(display));
    let (_, number) = display.rsplit_once(':').ok_or_else(bad)?;
    let number = number.split_once('.').map_or(number, |(n, _)| n);
    if number.is_empty()
        || !number.bytes().all(|b| b.is_ascii_digit())
        || display.chars().any(char::is_control)
    {
        return Err(bad());
    }
    Ok(display.to_owned())
}

fn pattern(what: &'static str, value: &str) -> Result<String, ConfigError> {
    if value.trim().is_empty() || value.chars().any(char::is_control) {
        return Err(ConfigError::Pattern {
            what,
            value: escape(value),
        });
    }
    Ok(value.to_owned())
}

/// Control characters escaped, so a message shows them rather than acting
/// them out on a terminal.
fn escape(text: &str) -> String {
    text.chars().flat_map(char::escape_debug).collect()
}

fn lower(text: &str) -> String {
    text.to_lowercase()
}

/// `*` and `?` glob matching on characters, case-insensitive.
pub(crate) fn glob_matches(glob: &str, text: &str) -> bool {
    let glob: Vec<char> = lower(glob).chars().collect();
    let text: Vec<char> = lower(text).chars().collect();
    // The classic greedy matcher with one backtrack point: linear in
    // practice, never exponential.
    let (mut g, mut t) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match glob.get(g) {
            Some('*') => {
                star = Some((g, t));
                g += 1;
            }
            Some(&c) if c == '?' || Some(&c) == text.get(t) => {
                g += 1;
                t += 1;
            }
            _ => match star {
                Some((sg, st)) => {
                    g = sg + 1;
                    t = st + 1;
                    star = Some((sg, st + 1));
                }
                None => return false,
            },
        }
    }
    glob.get(g..)
        .is_some_and(|rest| rest.iter().all(|&c| c == '*'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_regions_parse() {
        assert_eq!(
            "1280x800".parse::<Size>(),
            Ok(Size {
                width: 1280,
                height: 800
            })
        );
        for bad in ["", "1280", "0x800", "1280x-1", "99999x800", "axb"] {
            assert!(bad.parse::<Size>().is_err(), "{bad}");
        }
        let region: Region = "10,-5,200,100".parse().unwrap_or(Region {
            x: 0,
            y: 0,
            width: 1,
            height: 1,
        });
        assert_eq!(region.to_string(), "10,-5 200x100");
        assert!(region.contains(10, -5) && region.contains(209, 94));
        assert!(!region.contains(210, 0) && !region.contains(9, 0));
        for bad in ["1,2,3", "1,2,0,4", "a,b,c,d", "1,2,3,4,5"] {
            assert!(bad.parse::<Region>().is_err(), "{bad}");
        }
    }

    #[test]
    fn names_that_cannot_be_read_match_every_pattern() {
        let blackout = Blackout::new()
            .class("KeePassXC")
            .and_then(|b| b.title("*Password*"))
            .unwrap_or_default();
        let names = |class: &[&str], titles: &[&str]| WindowNames {
            class: class.iter().map(|&c| c.to_owned()).collect(),
            titles: titles.iter().map(|&t| t.to_owned()).collect(),
            ..WindowNames::default()
        };
        assert!(blackout.matches_window(&names(&["keepassxc"], &[])));
        assert!(blackout.matches_window(&names(&[], &["My password"])));
        assert!(!blackout.matches_window(&names(&["notes"], &["Notes"])));
        let unread_title = WindowNames {
            title_unread: true,
            ..names(&["notes"], &["Notes"])
        };
        assert!(blackout.matches_window(&unread_title));
        let unread_class = WindowNames {
            class_unread: true,
            ..names(&[], &["Notes"])
        };
        assert!(blackout.matches_window(&unread_class));
        // Nothing listed of that kind: nothing to match.
        let regions_only = Blackout::new().region(Region {
            x: 0,
            y: 0,
            width: 1,
            height: 1,
        });
        assert!(!regions_only.matches_window(&unread_title));
        assert!(!regions_only.matches_window(&unread_class));
    }

    #[test]
    fn globs_match_case_insensitively() {
        let check = |glob: &str, text: &str, expected: bool| {
            assert_eq!(glob_matches(glob, text), expected, "{glob} on {text}");
        };
        check("*Password*", "Enter password - KeePassXC", true);
        check("*password*", "Passwords", true);
        check("a?c", "ABC", true);
        check("a?c", "ac", false);
        check("*", "", true);
        check("", "", true);
        check("x", "", false);
        check("*.kdbx - *", "db.kdbx - KeePassXC", true);
        check("*a*a*a*a*b", &"a".repeat(200), false);
    }

    #[test]
    fn the_file_reads_fail_closed() {
        let config = DesktopConfig::parse(
            "display = \":3\"\nsize = \"800x600\"\nroot_clicks = true\n[blackout]\nclasses = [\"KeePassXC\"]\ntitles = [\"*Password*\"]\nregions = [\"0,0,200,100\"]\n",
        );
        let Ok(config) = config else {
            unreachable!("{config:?}")
        };
        assert_eq!(config.display.as_deref(), Some(":3"));
        assert_eq!(config.size.to_string(), "800x600");
        assert_eq!(config.id, "desktop");
        assert!(config.root_clicks);
        assert_eq!(
            config.blackout.describe(),
            "Blacked out before any pixel leaves the device: windows of class KeePassXC; windows titled *Password*; screen region 0,0 200x100."
        );
        for bad in [
            "colour = 1",
            "size = \"big\"",
            "[blackout]\nregions = [\"1,2\"]",
            "[blackout]\nwindows = []",
            "[blackout]\nclasses = [\"\"]",
            "display = \"nope\"",
            "id = 3",
            "root_clicks = \"yes\"",
        ] {
            assert!(DesktopConfig::parse(bad).is_err(), "{bad}");
        }
        assert!(
            DesktopConfig::parse("colour = 1").is_err_and(|e| e.to_string().contains("colour"))
        );
    }
}
