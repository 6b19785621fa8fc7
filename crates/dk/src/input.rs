//! Reading the files the commands are given, with a size cap, and printing
//! untrusted text safely on a terminal.

use std::io::Read;
use std::path::Path;

/// Largest file a command reads (4 MiB).
pub const MAX_INPUT_BYTES: u64 = 4 << 20;

/// Reads `path` as UTF-8 text, or standard input when `path` is `-`.
pub fn read_text(path: &Path) -> Result<String, String> {
    let shown = path.display();
    let mut bytes = Vec::new();
    let read = if path == Path::new("-") {
        std::io::stdin()
            .take(MAX_INPUT_BYTES + 1)
            .read_to_end(&mut bytes)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(MAX_INPUT_BYTES + 1).read_to_end(&mut bytes))
    };
    read.map_err(|e| format!("cannot read `{shown}`: {e}"))?;
    if bytes.len() as u64 > MAX_INPUT_BYTES {
        return Err(format!("`{shown}` is larger than {MAX_INPUT_BYTES} bytes"));
    }
    String::from_utf8(bytes).map_err(|_| format!("`{shown}` is not UTF-8 text"))
}

/// `text` with every character a device may not put in text (controls,
/// escapes, invisible and bidirectional characters) shown as a `\u{..}`
/// escape, so printing it cannot drive the terminal.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if dk_proto::is_unsafe_char(c) {
            out.push_str(&c.escape_unicode().to_string());
        } else {
            out.push(c);
        }
    }
    out
}

/// Prints `value` as one line of JSON on standard output.
pub fn print_json(value: &serde_json::Value) {
    match serde_json::to_string(value) {
        Ok(text) => println!("{text}"),
        Err(e) => eprintln!("error: {e}"),
    }
}

/// When `at_ms` (milliseconds since the Unix epoch) was, from now: `paired 5
/// minutes ago` style text.
pub fn ago(at_ms: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let seconds = now.saturating_sub(at_ms) / 1000;
    match seconds {
        0..=119 => format!("paired {seconds} seconds ago"),
        120..=7199 => format!("paired {} minutes ago", seconds / 60),
        7200..=172_799 => format!("paired {} hours ago", seconds / 3600),
        _ => format!("paired {} days ago", seconds / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_naturally() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert_eq!(ago(now), "paired 0 seconds ago");
        assert_eq!(ago(now - 300_000), "paired 5 minutes ago");
        assert_eq!(ago(now - 3 * 3_600_000), "paired 3 hours ago");
        assert_eq!(ago(now - 4 * 86_400_000), "paired 4 days ago");
        assert_eq!(ago(now + 10_000), "paired 0 seconds ago");
    }

    #[test]
    fn printable_escapes_what_a_terminal_would_act_on() {
        assert_eq!(printable("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(printable("Küche 😀"), "Küche 😀");
    }
}
