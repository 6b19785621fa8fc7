//! The frame every page shares (its head, the navigation, the microphones
//! banner, signing out) and the pages outside a session.

use std::fmt::Write as _;

use dk_proto::admin as api;

use super::{Frame, Page, utc};
use crate::console::html::{attr, segment, text};

/// A page's whole document around `main`.
pub(super) fn layout(frame: &Frame, title: &str, main: &str) -> String {
    let mut out = String::with_capacity(main.len() + 2048);
    let badge = if frame.pending > 0 {
        format!("({}) ", frame.pending)
    } else {
        String::new()
    };
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{badge}{title} · dk console</title>\
         <link rel=\"stylesheet\" href=\"/console/assets/console.css\">\
         <script src=\"/console/assets/console.js\" defer></script></head>\
         <body data-pending=\"{pending}\" data-title=\"{title} · dk console\" data-base=\"{base}\">\
         <a class=\"skip\" href=\"#main\">Skip to content</a>{banner}\
         <header><nav aria-label=\"Console\"><ul>",
        title = attr(title),
        pending = frame.pending,
        base = attr(&frame.base),
        banner = microphones_banner(&frame.microphones, &frame.base, &frame.csrf),
    );
    let items = [
        (Page::Prompts, "/", "Waiting"),
        (Page::Devices, "/devices", "Devices"),
        (Page::Agents, "/agents", "Agents"),
        (
            Page::Audit,
            "/audit",
            "Audit<span class=\"long\">&nbsp;log</span>",
        ),
        (Page::Status, "/status", "Status"),
    ];
    let base = &frame.base;
    for (page, href, label) in items {
        let current = if page == frame.current {
            " aria-current=\"page\""
        } else {
            ""
        };
        let _ = write!(out, "<li><a href=\"{base}{href}\"{current}>{label}");
        if page == Page::Prompts {
            let hidden = if frame.pending == 0 { " hidden" } else { "" };
            let _ = write!(
                out,
                " <span id=\"badge\" class=\"badge\"{hidden}><span class=\"visually-hidden\">, waiting: </span>{}</span>",
                frame.pending
            );
        }
        out.push_str("</a></li>");
    }
    // Sign out is in the header on a desk, and at the foot of the page on
    // a phone, where the header is one row of navigation (the style sheet
    // shows one of the two).
    let sign_out = |place: &str| {
        format!(
            "<form method=\"post\" action=\"{base}/logout\" class=\"signout {place}\">{}\
             <button type=\"submit\">Sign out</button></form>",
            csrf_field(&frame.csrf)
        )
    };
    let _ = write!(
        out,
        "</ul>{top}</nav></header>\
         <main id=\"main\" tabindex=\"-1\">{main}</main>\
         <footer>{bottom}</footer>\
         <div id=\"announce\" class=\"visually-hidden\" aria-live=\"polite\"></div>\
         </body></html>",
        top = sign_out("top"),
        bottom = sign_out("bottom"),
    );
    out
}

/// The banner at the top of every page while a microphone is open: each
/// one live, with a stop button (a plain form, so it works without the
/// script and from a phone). Hidden, and empty, while none is; the live
/// feed replaces its content as microphones open and close.
pub(crate) fn microphones_banner(
    microphones: &[api::LiveMicrophone],
    base: &str,
    csrf: &str,
) -> String {
    let hidden = if microphones.is_empty() {
        " hidden"
    } else {
        ""
    };
    format!(
        "<div id=\"microphones\" class=\"microphones\" role=\"region\" \
         aria-label=\"Microphones live\" aria-live=\"assertive\"{hidden}>{}</div>",
        microphones_live(microphones, base, csrf)
    )
}

/// The banner's content: one line and stop button for each microphone.
pub(crate) fn microphones_live(
    microphones: &[api::LiveMicrophone],
    base: &str,
    csrf: &str,
) -> String {
    let mut out = String::new();
    for mic in microphones {
        let device = text(&mic.device_id);
        let _ = write!(
            out,
            "<div class=\"mic\" data-device=\"{device_attr}\">\
             <p><span class=\"dot\" aria-hidden=\"true\"></span>\
             <strong>Microphone live</strong> on <code>{device}</code> \
             ({capability}, at most {max} s, since {since} UTC)</p>\
             <form method=\"post\" action=\"{base}/microphones/{segment}/stop\" class=\"mic-stop\">{csrf}\
             <button type=\"submit\" class=\"stop\" aria-label=\"Stop the microphone of {device_attr}\">Stop</button>\
             </form></div>",
            device_attr = attr(&mic.device_id),
            capability = text(&mic.capability),
            max = mic.max_seconds,
            since = utc(mic.since_ms),
            segment = segment(&mic.device_id),
            csrf = csrf_field(csrf),
        );
    }
    out
}

pub(super) fn csrf_field(csrf: &str) -> String {
    format!(
        "<input type=\"hidden\" name=\"csrf\" value=\"{}\">",
        attr(csrf)
    )
}

/// A page with a heading and a sentence, outside any session.
pub(crate) fn message_page(title: &str, message: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{plain} · dk console</title>\
         <link rel=\"stylesheet\" href=\"/console/assets/console.css\"></head>\
         <body><main id=\"main\"><h1>{title}</h1><p>{message}</p></main></body></html>",
        plain = attr(title),
        title = text(title),
        message = text(message),
    )
}

/// The sign-in page at `/console/`: how to sign in. Its script forwards a
/// browser that signed in before to its console (the path is kept in the
/// console origin's own storage, which no other port can read).
pub(crate) fn landing_page() -> String {
    "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
     <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
     <title>Sign in · dk console</title>\
     <link rel=\"stylesheet\" href=\"/console/assets/console.css\">\
     <script src=\"/console/assets/console.js\" defer></script></head>\
     <body data-landing=\"yes\"><main id=\"main\"><h1>Sign in to the dk console</h1>\
     <p>Open the login link `dk vessel` printed, or run `dk console` for a fresh one.</p>\
     </main></body></html>"
        .to_owned()
}

/// What a request without a session sees.
pub(crate) fn signed_out_page() -> String {
    message_page(
        "Sign in to the dk console",
        "Open the login link `dk vessel` printed, or run `dk console` for a fresh one.",
    )
}
