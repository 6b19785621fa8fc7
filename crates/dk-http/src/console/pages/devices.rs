//! The devices page and one device's page: its grants, events and activity.

use dk_proto::admin as api;
use maud::{Markup, html};

use super::audit::audit_table;
use super::frame::{csrf_field, layout};
use super::prompts::{details, kind_label};
use super::shared::{Frame, RecentEvent, utc};
use crate::console::html::{Attr, Text, segment};
use crate::store::AuditEntry;

/// The devices page: every paired device, one row each.
pub(crate) fn devices(frame: &Frame, devices: &[api::Device]) -> String {
    let base = &frame.base;
    let main = html! {
        h1 { "Devices" }
        p {
            (devices.len()) " paired, "
            (devices.iter().filter(|d| d.connected).count()) " connected."
        }
        @if devices.is_empty() {
            p {
                "No device is paired. Start one (`dk device simulate lamp`) and its pairing \
                 appears under Waiting."
            }
        } @else {
            table class="devices" {
                thead {
                    tr {
                        th scope="col" { "Device" }
                        th scope="col" { "State" }
                        th scope="col" { "Allowed" }
                    }
                }
                tbody {
                    @for device in devices {
                        tr {
                            th scope="row" {
                                a href={ (base) "/devices/" (segment(&device.id)) } { (Text(&device.name)) }
                                " "
                                code { (Text(&device.id)) }
                            }
                            td { (connection_state(device)) }
                            td {
                                (device.grants.len()) " of "
                                (device.capabilities.len() + device.events.len())
                            }
                        }
                    }
                }
            }
        }
    };
    layout(frame, "Devices", main)
}

/// One switch of a device's page: a capability or a declared event, allowed
/// or not, pressed to change it.
struct GrantSwitch<'a> {
    name: &'a str,
    tag: &'static str,
    description: &'a str,
    details: Markup,
}

impl GrantSwitch<'_> {
    fn markup(&self, frame: &Frame, device: &api::Device, base: &str) -> Markup {
        let on = device.grants.iter().any(|g| g == self.name);
        html! {
            li {
                form method="post"
                    action={ (base) "/devices/" (segment(&device.id)) "/grants/" (segment(self.name)) } {
                    (csrf_field(&frame.csrf))
                    input type="hidden" name="allow" value=(if on { "no" } else { "yes" });
                    button type="submit" role="switch" aria-checked=(on) class="switch"
                        aria-label={
                            (if on { "Allowed, press to revoke" } else { "Not allowed, press to allow" })
                            ": " (Attr(self.name))
                        } {
                        (if on { "allowed" } else { "off" })
                    }
                    " "
                    strong { (Text(self.name)) }
                    " "
                    span class={ "tag " (self.tag.replace(' ', "-")) } { (self.tag) }
                    " "
                    span class="description" { (Text(self.description)) }
                    (self.details)
                }
            }
        }
    }
}

fn connection_state(device: &api::Device) -> Markup {
    let channel = if device.channel.is_encrypted() {
        "dk/2"
    } else {
        "v1"
    };
    html! {
        @if device.connected {
            span class="state on" { "connected" }
        } @else {
            span class="state off" { "not connected" }
        }
        " (" (channel) ")"
    }
}

/// One device: its grants as switches, unpairing, recent events and
/// recent entries of the log.
pub(crate) fn device(
    frame: &Frame,
    device: &api::Device,
    events: &[RecentEvent],
    activity: &[AuditEntry],
) -> String {
    let base = &frame.base;
    let switches = device
        .capabilities
        .iter()
        .map(|capability| GrantSwitch {
            name: &capability.name,
            tag: kind_label(capability),
            description: &capability.description,
            details: details(&capability.claims, &capability.params),
        })
        .chain(device.events.iter().map(|event| GrantSwitch {
            name: &event.name,
            tag: "event",
            description: &event.description,
            details: details(&[], &event.params),
        }));
    let main = html! {
        h1 { (Text(&device.name)) }
        p class="meta" {
            code { (Text(&device.id)) } ", kind " (Text(&device.kind)) ", version "
            (Text(&device.version)) ", paired " (utc(device.paired_at_ms))
        }
        p id="device-state" { (connection_state(device)) }
        h2 { "What it may do" }
        ul class="grants" {
            @for switch in switches { (switch.markup(frame, device, base)) }
        }
        form method="post" action={ (base) "/devices/" (segment(&device.id)) "/unpair" }
            data-confirm={ "Unpair " (Attr(&device.name)) "? It must pair again to be used." } {
            (csrf_field(&frame.csrf))
            button type="submit" class="no" { "Unpair" }
        }
        h2 { "Recent events" }
        @if events.is_empty() {
            p { "None since the vessel started." }
        } @else {
            ul class="events" {
                @for event in events {
                    li {
                        (utc(event.at_ms)) " " strong { (Text(&event.capability)) } " "
                        code { (Text(&event.data)) }
                    }
                }
            }
        }
        h2 { "Recent activity" }
        (audit_table(activity))
        p { a href={ (base) "/audit?device=" (segment(&device.id)) } { "All of its log" } }
    };
    layout(frame, &device.name, main)
}
