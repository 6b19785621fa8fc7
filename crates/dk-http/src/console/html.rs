//! Writing HTML safely: every text a device, an agent or a file wrote goes
//! through [`text`] (in a template, [`Text`]), which escapes markup and
//! shows characters that would hide or reorder what the person reads
//! (controls, bidi overrides, invisible characters) as visible `\u{..}`
//! marks. The pages' templates are `maud`'s, which escape whatever else is
//! put in them.

use std::fmt::Write as _;

use dk_proto::is_unsafe_char;
use maud::Render;

/// `value` as HTML text: markup escaped, unusual characters shown as marks.
pub(crate) fn text(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 8);
    push_text(&mut out, value);
    out
}

/// Appends `value` to `out` as [`text`] writes it.
pub(crate) fn push_text(out: &mut String, value: &str) {
    escape(out, value, |out, c| {
        let _ = write!(
            out,
            "<span class=\"mark\" title=\"hidden character\">\\u{{{:04X}}}</span>",
            u32::from(c)
        );
    });
}

/// `value` for an attribute in double quotes: markup escaped, unusual
/// characters written as the same visible marks, in plain text.
pub(crate) fn attr(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 8);
    escape(&mut out, value, |out, c| {
        let _ = write!(out, "\\u{{{:04X}}}", u32::from(c));
    });
    out
}

/// What a device, an agent or a file wrote, in a template: written as
/// [`text`] writes it (`(Text(name))` in `maud::html!`).
pub(crate) struct Text<'a>(pub(crate) &'a str);

impl Render for Text<'_> {
    fn render_to(&self, buffer: &mut String) {
        push_text(buffer, self.0);
    }
}

/// What a device, an agent or a file wrote, in a template's attribute:
/// written as [`attr`] writes it (`title=(Attr(name))`).
pub(crate) struct Attr<'a>(pub(crate) &'a str);

impl Render for Attr<'_> {
    fn render_to(&self, buffer: &mut String) {
        buffer.push_str(&attr(self.0));
    }
}

/// The console's own text (JSON it wrote, say) as HTML text: markup
/// escaped, every other character as it is, so what is copied from the
/// page is exactly what the console made. Never for what a device, an
/// agent or a file wrote: that goes through [`text`].
pub(crate) fn own(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 8);
    escape(&mut out, value, |out, c| out.push(c));
    out
}

/// Appends `value` to `out`, markup escaped, each unusual character
/// written by `mark`.
fn escape(out: &mut String, value: &str, mark: impl Fn(&mut String, char)) {
    for c in value.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if is_unsafe_char(c) => mark(out, c),
            c => out.push(c),
        }
    }
}

/// `value` as one path segment of a URL: everything but unreserved
/// characters percent-encoded.
pub(crate) fn segment(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{attr, own, segment, text};

    #[test]
    fn markup_is_escaped_and_hidden_characters_are_shown() {
        assert_eq!(
            text("<b>\"Lamp\" & 'co'</b>"),
            "&lt;b&gt;&quot;Lamp&quot; &amp; &#39;co&#39;&lt;/b&gt;"
        );
        // A right-to-left override, an escape and a zero-width space.
        let shown = text("lamp\u{202E}kcol\u{1b}[2J\u{200B}");
        assert!(!shown.contains('\u{202E}') && !shown.contains('\u{1b}'));
        assert!(shown.contains("\\u{202E}") && shown.contains("\\u{001B}"));
        assert!(shown.contains("\\u{200B}"));
        assert_eq!(attr("a\"\u{202E}"), "a&quot;\\u{202E}");
        assert_eq!(segment("a b/c%"), "a%20b%2Fc%25");
        // The console's own JSON keeps its newlines and indents.
        assert_eq!(
            own("{\n  \"a\": \"<b>\"\n}"),
            "{\n  &quot;a&quot;: &quot;&lt;b&gt;&quot;\n}"
        );
        assert_eq!(segment("é"), "%C3%A9");
    }
}
