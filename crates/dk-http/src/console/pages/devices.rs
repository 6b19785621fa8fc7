//! The devices page and one device's page: its grants, events and activity.

use std::fmt::Write as _;

use dk_proto::admin as api;
use maud::PreEscaped;

use super::audit::audit_table;
use super::frame::{csrf_field, layout};
use super::prompts::{details, kind_label};
use super::{Frame, RecentEvent, utc};
use crate::console::html::{attr, segment, text};
use crate::store::AuditEntry;

/// The devices page: every paired device, one row each.
pub(crate) fn devices(frame: &Frame, devices: &[api::Device]) -> String {
    let base = &frame.base;
    let mut main = String::with_capacity(256 + devices.len() * 400);
    let _ = write!(
        main,
        "<h1>Devices</h1><p>{} paired, {} connected.</p>",
        devices.len(),
        devices.iter().filter(|d| d.connected).count()
    );
    if devices.is_empty() {
        main.push_str("<p>No device is paired. Start one (`dk device simulate lamp`) and its pairing appears under Waiting.</p>");
        return layout(frame, "Devices", PreEscaped(main));
    }
    main.push_str(
        "<table class=\"devices\"><thead><tr><th scope=\"col\">Device</th><th scope=\"col\">State</th>\
         <th scope=\"col\">Allowed</th></tr></thead><tbody>",
    );
    for device in devices {
        let _ = write!(
            main,
            "<tr><th scope=\"row\"><a href=\"{base}/devices/{href}\">{name}</a> <code>{id}</code></th>\
             <td>{state}</td><td>{granted} of {all}</td></tr>",
            href = segment(&device.id),
            name = text(&device.name),
            id = text(&device.id),
            state = connection_state(device),
            granted = device.grants.len(),
            all = device.capabilities.len() + device.events.len(),
        );
    }
    main.push_str("</tbody></table>");
    layout(frame, "Devices", PreEscaped(main))
}

/// One switch of a device's page: a capability or a declared event, allowed
/// or not, pressed to change it.
struct GrantSwitch<'a> {
    name: &'a str,
    tag: &'static str,
    description: &'a str,
    details: String,
}

impl GrantSwitch<'_> {
    fn write(&self, main: &mut String, frame: &Frame, device: &api::Device, base: &str) {
        let on = device.grants.iter().any(|g| g == self.name);
        let _ = write!(
            main,
            "<li><form method=\"post\" action=\"{base}/devices/{href}/grants/{cap_href}\">{csrf}\
             <input type=\"hidden\" name=\"allow\" value=\"{next}\">\
             <button type=\"submit\" role=\"switch\" aria-checked=\"{on}\" class=\"switch\" \
             aria-label=\"{label}: {name}\">{shown}</button> <strong>{name_text}</strong> \
             <span class=\"tag {tag}\">{kind}</span> <span class=\"description\">{description}</span>{details}</form></li>",
            href = segment(&device.id),
            cap_href = segment(self.name),
            csrf = csrf_field(&frame.csrf).into_string(),
            next = if on { "no" } else { "yes" },
            label = if on {
                "Allowed, press to revoke"
            } else {
                "Not allowed, press to allow"
            },
            name = attr(self.name),
            shown = if on { "allowed" } else { "off" },
            name_text = text(self.name),
            tag = self.tag.replace(' ', "-"),
            kind = self.tag,
            description = text(self.description),
            details = self.details,
        );
    }
}

fn connection_state(device: &api::Device) -> String {
    let channel = if device.channel.is_encrypted() {
        "dk/2"
    } else {
        "v1"
    };
    if device.connected {
        format!("<span class=\"state on\">connected</span> ({channel})")
    } else {
        format!("<span class=\"state off\">not connected</span> ({channel})")
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
    let mut main = String::with_capacity(4096);
    let _ = write!(
        main,
        "<h1>{name}</h1><p class=\"meta\"><code>{id}</code>, kind {kind}, version {version}, paired {paired}</p>\
         <p id=\"device-state\">{state}</p><h2>What it may do</h2><ul class=\"grants\">",
        name = text(&device.name),
        id = text(&device.id),
        kind = text(&device.kind),
        version = text(&device.version),
        paired = utc(device.paired_at_ms),
        state = connection_state(device),
    );
    for capability in &device.capabilities {
        let label = kind_label(capability);
        let switch = GrantSwitch {
            name: &capability.name,
            tag: label,
            description: &capability.description,
            details: details(&capability.claims, &capability.params),
        };
        switch.write(&mut main, frame, device, base);
    }
    for event in &device.events {
        let switch = GrantSwitch {
            name: &event.name,
            tag: "event",
            description: &event.description,
            details: details(&[], &event.params),
        };
        switch.write(&mut main, frame, device, base);
    }
    let _ = write!(
        main,
        "</ul><form method=\"post\" action=\"{base}/devices/{href}/unpair\" data-confirm=\"Unpair {confirm}? It must pair again to be used.\">{csrf}\
         <button type=\"submit\" class=\"no\">Unpair</button></form><h2>Recent events</h2>",
        href = segment(&device.id),
        confirm = attr(&device.name),
        csrf = csrf_field(&frame.csrf).into_string(),
    );
    if events.is_empty() {
        main.push_str("<p>None since the vessel started.</p>");
    } else {
        main.push_str("<ul class=\"events\">");
        for event in events {
            let _ = write!(
                main,
                "<li>{} <strong>{}</strong> <code>{}</code></li>",
                utc(event.at_ms),
                text(&event.capability),
                text(&event.data)
            );
        }
        main.push_str("</ul>");
    }
    main.push_str("<h2>Recent activity</h2>");
    audit_table(&mut main, activity);
    let _ = write!(
        main,
        "<p><a href=\"{base}/audit?device={}\">All of its log</a></p>",
        segment(&device.id)
    );
    layout(frame, &device.name, PreEscaped(main))
}
