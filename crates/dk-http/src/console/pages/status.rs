//! The status page: the vessel's figures.

use std::fmt::Write as _;

use dk_proto::admin as api;
use maud::PreEscaped;

use super::Frame;
use super::frame::layout;
use crate::console::html::text;

/// The vessel's state: counts, the key's fingerprint, the listeners.
pub(crate) fn status(frame: &Frame, status: &api::Status) -> String {
    let mut main = String::from("<h1>Status</h1><dl class=\"facts\">");
    let rows = [
        ("Paired devices", status.paired.to_string()),
        ("Connected", status.connected.to_string()),
        ("Device connections", status.connections.to_string()),
        ("Waiting for you", status.pending.to_string()),
        (
            "Vessel key fingerprint",
            status
                .fingerprint
                .clone()
                .unwrap_or_else(|| "none".to_owned()),
        ),
        ("Encrypted handshakes", status.secure_handshakes.to_string()),
        ("Channel failures", status.channel_failures.to_string()),
        ("Plain v1 refused", status.plain_v1_refused.to_string()),
    ];
    for (label, value) in rows {
        let _ = write!(main, "<dt>{label}</dt><dd>{}</dd>", text(&value));
    }
    let _ = write!(
        main,
        "<dt>This console session</dt><dd><code id=\"session\">{}</code> \
         (the audit log names changes made here by it)</dd>",
        text(&frame.session)
    );
    main.push_str("</dl><h2>Listeners</h2><table><thead><tr><th scope=\"col\">Listener</th><th scope=\"col\">Open</th><th scope=\"col\">Peak</th><th scope=\"col\">Refused at accept</th><th scope=\"col\">Idle closed</th></tr></thead><tbody>");
    let listeners = [
        ("devices", &status.listeners.devices),
        ("admin", &status.listeners.admin),
        ("MCP", &status.listeners.mcp),
        ("admin socket", &status.listeners.admin_socket),
        ("MCP socket", &status.listeners.mcp_socket),
    ];
    for (name, counts) in listeners {
        let _ = write!(
            main,
            "<tr><th scope=\"row\">{name}</th><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            counts.open, counts.peak, counts.refused_at_accept, counts.idle_closed
        );
    }
    main.push_str("</tbody></table>");
    layout(frame, "Status", PreEscaped(main))
}
