//! The frame every page shares (its head, the navigation, the microphones
//! banner, signing out) and the pages outside a session.

use dk_proto::admin as api;
use maud::{Markup, PreEscaped, html};

use super::shared::{Frame, Page, utc};
use crate::console::html::{Attr, Text, segment};

/// What every document starts with.
const DOCTYPE: PreEscaped<&str> = PreEscaped("<!doctype html>\n");

/// A page's whole document around `main`.
pub(super) fn layout(frame: &Frame, title: &str, main: Markup) -> String {
    let badge = (frame.pending > 0).then(|| format!("({}) ", frame.pending));
    let items = [
        (Page::Prompts, "/", html! { "Waiting" }),
        (Page::Devices, "/devices", html! { "Devices" }),
        (Page::Agents, "/agents", html! { "Agents" }),
        (
            Page::Audit,
            "/audit",
            html! { "Audit" span.long { (PreEscaped("&nbsp;")) "log" } },
        ),
        (Page::Status, "/status", html! { "Status" }),
    ];
    let base = &frame.base;
    // Sign out is in the header on a desk, and at the foot of the page on
    // a phone, where the header is one row of navigation (the style sheet
    // shows one of the two).
    let sign_out = |place: &str| {
        html! {
            form method="post" action={ (base) "/logout" } class={ "signout " (place) } {
                (csrf_field(&frame.csrf))
                button type="submit" { "Sign out" }
            }
        }
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { @if let Some(badge) = &badge { (badge) } (Attr(title)) " · dk console" }
                link rel="stylesheet" href="/console/assets/console.css";
                script src="/console/assets/console.js" defer {}
            }
            body data-pending=(frame.pending) data-title={ (Attr(title)) " · dk console" } data-base=(Attr(base)) {
                a.skip href="#main" { "Skip to content" }
                (microphones_banner(&frame.microphones, base, &frame.csrf))
                header {
                    nav aria-label="Console" {
                        ul {
                            @for (page, href, label) in items {
                                li {
                                    a href={ (base) (href) } aria-current=[(page == frame.current).then_some("page")] {
                                        (label)
                                        @if page == Page::Prompts {
                                            " "
                                            span id="badge" class="badge" hidden[frame.pending == 0] {
                                                span.visually-hidden { ", waiting: " }
                                                (frame.pending)
                                            }
                                        }
                                    }
                                }
                            }
                        }
                        (sign_out("top"))
                    }
                }
                main #main tabindex="-1" { (main) }
                footer { (sign_out("bottom")) }
                div id="announce" class="visually-hidden" aria-live="polite" {}
            }
        }
    }
    .into_string()
}

/// The banner at the top of every page while a microphone is open: each
/// one live, with a stop button (a plain form, so it works without the
/// script and from a phone). Hidden, and empty, while none is; the live
/// feed replaces its content as microphones open and close.
fn microphones_banner(microphones: &[api::LiveMicrophone], base: &str, csrf: &str) -> Markup {
    html! {
        div id="microphones" class="microphones" role="region" aria-label="Microphones live"
            aria-live="assertive" hidden[microphones.is_empty()] {
            (microphones_markup(microphones, base, csrf))
        }
    }
}

/// The banner's content: one line and stop button for each microphone.
pub(crate) fn microphones_live(
    microphones: &[api::LiveMicrophone],
    base: &str,
    csrf: &str,
) -> String {
    microphones_markup(microphones, base, csrf).into_string()
}

/// [`microphones_live`]'s markup.
fn microphones_markup(microphones: &[api::LiveMicrophone], base: &str, csrf: &str) -> Markup {
    html! {
        @for mic in microphones {
            div.mic data-device=(Attr(&mic.device_id)) {
                p {
                    span.dot aria-hidden="true" {}
                    strong { "Microphone live" } " on " code { (Text(&mic.device_id)) } " "
                    "(" (Text(&mic.capability)) ", at most " (mic.max_seconds) " s, since "
                    (utc(mic.since_ms)) " UTC)"
                }
                form method="post" action={ (base) "/microphones/" (segment(&mic.device_id)) "/stop" } class="mic-stop" {
                    (csrf_field(csrf))
                    button type="submit" class="stop" aria-label={ "Stop the microphone of " (Attr(&mic.device_id)) } { "Stop" }
                }
            }
        }
    }
}

/// The session's CSRF token, as a form's hidden field.
pub(super) fn csrf_field(csrf: &str) -> Markup {
    html! { input type="hidden" name="csrf" value=(Attr(csrf)); }
}

/// A page with a heading and a sentence, outside any session.
pub(crate) fn message_page(title: &str, message: &str) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (Attr(title)) " · dk console" }
                link rel="stylesheet" href="/console/assets/console.css";
            }
            body { main #main { h1 { (Text(title)) } p { (Text(message)) } } }
        }
    }
    .into_string()
}

/// The sign-in page at `/console/`: how to sign in. Its script forwards a
/// browser that signed in before to its console (the path is kept in the
/// console origin's own storage, which no other port can read).
pub(crate) fn landing_page() -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "Sign in · dk console" }
                link rel="stylesheet" href="/console/assets/console.css";
                script src="/console/assets/console.js" defer {}
            }
            body data-landing="yes" {
                main #main {
                    h1 { "Sign in to the dk console" }
                    p { "Open the login link `dk vessel` printed, or run `dk console` for a fresh one." }
                }
            }
        }
    }
    .into_string()
}

/// What a request without a session sees.
pub(crate) fn signed_out_page() -> String {
    message_page(
        "Sign in to the dk console",
        "Open the login link `dk vessel` printed, or run `dk console` for a fresh one.",
    )
}
