//! The status page: the vessel's figures.

use dk_proto::admin as api;
use maud::html;

use super::frame::layout;
use super::shared::Frame;
use crate::console::html::Text;

/// The vessel's state: counts, the key's fingerprint, the listeners.
pub(crate) fn status(frame: &Frame, status: &api::Status) -> String {
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
    let listeners = [
        ("devices", &status.listeners.devices),
        ("admin", &status.listeners.admin),
        ("MCP", &status.listeners.mcp),
        ("admin socket", &status.listeners.admin_socket),
        ("MCP socket", &status.listeners.mcp_socket),
    ];
    let main = html! {
        h1 { "Status" }
        dl class="facts" {
            @for (label, value) in rows {
                dt { (label) }
                dd { (Text(&value)) }
            }
            dt { "This console session" }
            dd {
                code id="session" { (Text(&frame.session)) }
                " (the audit log names changes made here by it)"
            }
        }
        h2 { "Listeners" }
        table {
            thead {
                tr {
                    th scope="col" { "Listener" }
                    th scope="col" { "Open" }
                    th scope="col" { "Peak" }
                    th scope="col" { "Refused at accept" }
                    th scope="col" { "Idle closed" }
                }
            }
            tbody {
                @for (name, counts) in listeners {
                    tr {
                        th scope="row" { (name) }
                        td { (counts.open) }
                        td { (counts.peak) }
                        td { (counts.refused_at_accept) }
                        td { (counts.idle_closed) }
                    }
                }
            }
        }
    };
    layout(frame, "Status", main)
}
