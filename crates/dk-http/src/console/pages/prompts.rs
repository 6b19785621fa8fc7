//! The waiting page: each open prompt (a pairing, an approval) as a card
//! with its forms, also sent alone on the live feed.

use std::fmt::Write as _;

use dk_proto::admin as api;
use maud::PreEscaped;
use serde_json::Value;

use super::frame::{csrf_field, layout};
use super::{Frame, cut, now_ms, utc};
use crate::console::html::{attr, text};

/// One line for screen readers and notifications: what is asked.
pub(crate) fn summary(pending: &api::Pending) -> String {
    match &pending.prompt {
        api::Prompt::Consent(c) => format!("{} ({}) asks to pair", c.name, c.device_id),
        api::Prompt::Approval(a) => match &a.microphone {
            Some(microphone) => format!(
                "{} asks to use {}: {} (the microphone, {})",
                a.agent_id.as_deref().unwrap_or("a call"),
                a.device_id,
                a.capability,
                microphone.words()
            ),
            None => format!(
                "{} asks to use {}: {}",
                a.agent_id.as_deref().unwrap_or("a call"),
                a.device_id,
                a.capability
            ),
        },
    }
}

/// The waiting page: every open prompt as a card.
pub(crate) fn prompts(frame: &Frame, pending: &[api::Pending]) -> String {
    let mut main = String::from("<h1>Waiting for you</h1>");
    let none_hidden = if pending.is_empty() { "" } else { " hidden" };
    let _ = write!(
        main,
        "<p id=\"none\"{none_hidden}>Nothing is waiting. New pairings and approvals appear here as they come.</p>\
         <div id=\"prompts\">"
    );
    for prompt in pending {
        main.push_str(&prompt_card(prompt, &frame.base, &frame.csrf));
    }
    main.push_str("</div>");
    layout(frame, "Waiting", PreEscaped(main))
}

/// One prompt's card, with its forms.
pub(crate) fn prompt_card(pending: &api::Pending, base: &str, csrf: &str) -> String {
    let left = pending.expires_at_ms.saturating_sub(now_ms());
    match &pending.prompt {
        api::Prompt::Consent(consent) => consent_card(pending.id, consent, left, base, csrf),
        api::Prompt::Approval(approval) => {
            approval_card(pending.id, approval, pending.can_remember, left, base, csrf)
        }
    }
}

fn time_left(left_ms: u64) -> String {
    let secs = left_ms / 1000;
    format!(
        "<p class=\"left\">Time left: <span data-left-ms=\"{left_ms}\">{}:{:02}</span> (then it is a no)</p>",
        secs / 60,
        secs % 60
    )
}

pub(super) fn kind_label(capability: &api::DeviceCapability) -> &'static str {
    match (capability.kind.as_str(), capability.confirm) {
        (_, true) => "asks every time",
        ("sensor", false) => "sensor",
        _ => "actuator",
    }
}

/// A capability's or an event's details under its name: the device's
/// claims (its annotations, said to be claims) and each param with its
/// bounds in words.
pub(super) fn details(claims: &[String], params: &[api::DeviceParam]) -> String {
    let mut out = String::new();
    if !claims.is_empty() {
        let _ = write!(
            out,
            "<span class=\"claims\">the device claims: {}</span>",
            text(&claims.join(", "))
        );
    }
    if !params.is_empty() {
        out.push_str("<ul class=\"params\">");
        for param in params {
            let required = if param.required { ", required" } else { "" };
            let bounds = param
                .bounds
                .as_deref()
                .map(|b| format!(", {}", text(b)))
                .unwrap_or_default();
            let _ = write!(
                out,
                "<li><code>{name}</code>: {ty}{required}{bounds}</li>",
                name = text(&param.name),
                ty = text(&param.ty),
            );
        }
        out.push_str("</ul>");
    }
    out
}

fn consent_card(
    id: u64,
    consent: &api::ConsentRequest,
    left: u64,
    base: &str,
    csrf: &str,
) -> String {
    let mut out = String::with_capacity(2048);
    let code_digits: String = consent.code.chars().collect();
    let spoken: Vec<String> = code_digits.chars().map(String::from).collect();
    let _ = write!(
        out,
        "<article class=\"prompt pairing\" id=\"prompt-{id}\" aria-labelledby=\"prompt-{id}-title\">\
         <h2 id=\"prompt-{id}-title\">Pair {name}</h2>\
         <p class=\"meta\">Device <code>{device}</code>, kind {kind}</p>",
        name = text(&consent.name),
        device = text(&consent.device_id),
        kind = text(&consent.kind),
    );
    if consent.no_screen {
        out.push_str(
            "<p class=\"warning\" role=\"note\">This device says it has no screen: no code proves \
             it is the one in front of you. Pair it only if you just started it yourself.</p>",
        );
    } else {
        let _ = write!(
            out,
            "<p>Check that the device shows this code:</p>\
             <p class=\"code\" aria-label=\"code {spoken}\">{code}</p>",
            spoken = attr(&spoken.join(" ")),
            code = text(&consent.code),
        );
    }
    let channel = if consent.channel.is_encrypted() {
        "<p class=\"channel ok\">Channel: encrypted (dk/2)</p>"
    } else {
        "<p class=\"channel warn\">Channel: not encrypted (v1)</p>"
    };
    out.push_str(channel);
    let credential = consent.replaces.as_ref().and_then(|old| old.credential);
    if let Some(change) = credential {
        let _ = write!(
            out,
            "<p class=\"warning\" role=\"alert\">Warning: {}. The code proves which device is asking now, \
             not that it is the one paired before.</p>",
            text(change.words())
        );
    }
    if let Some(old) = &consent.replaces {
        let _ = write!(
            out,
            "<div class=\"replaces\" role=\"note\"><p>This replaces the pairing made {} (grants now: {}).</p>",
            utc(old.paired_at_ms),
            if old.grants.is_empty() {
                "none".to_owned()
            } else {
                text(&old.grants.join(", "))
            }
        );
        if let Some(was) = &old.was_name {
            let _ = write!(out, "<p>It was named {}.</p>", text(was));
        }
        if let Some(was) = &old.was_kind {
            let _ = write!(out, "<p>It was of kind {}.</p>", text(was));
        }
        if !old.changes.is_empty() {
            out.push_str("<ul>");
            for change in &old.changes {
                let _ = write!(out, "<li>{}</li>", text(&change.summary));
            }
            out.push_str("</ul>");
        }
        out.push_str("</div>");
    }
    out.push_str(&time_left(left));
    let _ = write!(
        out,
        "<form method=\"post\" action=\"{base}/pairings/{id}\">{csrf}\
         <fieldset><legend>Allow</legend>",
        csrf = csrf_field(csrf).into_string()
    );
    for (n, capability) in consent.capabilities.iter().enumerate() {
        let input_id = format!("p{id}-c{n}");
        let label = kind_label(capability);
        let _ = write!(
            out,
            "<div class=\"check\"><input type=\"checkbox\" name=\"grant\" value=\"{value}\" id=\"{input_id}\">\
             <label for=\"{input_id}\"><strong>{name}</strong>{title} <span class=\"tag {tag}\">{label}</span>\
             <span class=\"description\">{description}</span>{details}</label></div>",
            value = attr(&capability.name),
            name = text(&capability.name),
            title = capability
                .title
                .as_deref()
                .map(|t| format!(" <em>{}</em>", text(t)))
                .unwrap_or_default(),
            tag = label.replace(' ', "-"),
            description = text(&capability.description),
            details = details(&capability.claims, &capability.params),
        );
    }
    for (n, event) in consent.events.iter().enumerate() {
        let input_id = format!("p{id}-e{n}");
        let _ = write!(
            out,
            "<div class=\"check\"><input type=\"checkbox\" name=\"grant\" value=\"{value}\" id=\"{input_id}\">\
             <label for=\"{input_id}\"><strong>{name}</strong> <span class=\"tag event\">event</span>\
             <span class=\"description\">{description}</span>{details}</label></div>",
            value = attr(&event.name),
            name = text(&event.name),
            description = text(&event.description),
            details = details(&[], &event.params),
        );
    }
    out.push_str("</fieldset>");
    if consent.no_screen {
        let _ = write!(
            out,
            "<div class=\"check\"><input type=\"checkbox\" name=\"without_code\" value=\"yes\" id=\"p{id}-nocode\">\
             <label for=\"p{id}-nocode\">I started this device myself and pair it without a code</label></div>"
        );
    }
    if let Some(change) = credential {
        let what = match change {
            api::CredentialChange::KeyChanged => "its key changed",
            api::CredentialChange::EncryptionDropped => "it drops encryption",
        };
        let _ = write!(
            out,
            "<div class=\"check\"><input type=\"checkbox\" name=\"credential_change\" value=\"yes\" id=\"p{id}-change\">\
             <label for=\"p{id}-change\">I know {what} and pair it anyway</label></div>"
        );
    }
    out.push_str(
        "<div class=\"actions\"><button type=\"submit\" name=\"answer\" value=\"pair\" class=\"yes\">Pair, allowing what is ticked</button>\
         <button type=\"submit\" name=\"answer\" value=\"refuse\" class=\"no\">Refuse</button></div></form></article>",
    );
    out
}

fn approval_card(
    id: u64,
    approval: &api::ApprovalRequest,
    can_remember: bool,
    left: u64,
    base: &str,
    csrf: &str,
) -> String {
    let mut out = String::with_capacity(2048);
    let who = match &approval.agent_id {
        Some(agent) => format!("Agent <strong>{}</strong>", text(agent)),
        None => "A call".to_owned(),
    };
    let _ = write!(
        out,
        "<article class=\"prompt approval\" id=\"prompt-{id}\" aria-labelledby=\"prompt-{id}-title\">\
         <h2 id=\"prompt-{id}-title\">{who} asks to use {device}: {capability}</h2>\
         <dl class=\"facts\"><dt>Tool</dt><dd><code>{tool}</code></dd>",
        device = text(&approval.device_id),
        capability = text(&approval.capability),
        tool = text(&approval.tool),
    );
    if let Some(session) = &approval.session_id {
        let _ = write!(
            out,
            "<dt>Session</dt><dd><code>{}</code></dd>",
            text(session)
        );
    }
    if let Some(microphone) = &approval.microphone {
        let _ = write!(
            out,
            "<dt>Microphone</dt><dd class=\"microphone-ask\"><strong>opens the microphone {}</strong></dd>",
            text(&microphone.words())
        );
    }
    let _ = write!(
        out,
        "<dt>Why you are asked</dt><dd>{}</dd><dt>Channel</dt><dd>{}</dd></dl>",
        text(&approval.reason),
        if approval.channel.is_encrypted() {
            "encrypted (dk/2)"
        } else {
            "not encrypted (v1)"
        }
    );
    if approval.input.is_empty() {
        out.push_str("<p>No input.</p>");
    } else {
        out.push_str("<table class=\"input\"><caption>Input</caption><tbody>");
        for (name, value) in &approval.input {
            let shown = match value {
                Value::String(s) => format!("\"{s}\""),
                other => other.to_string(),
            };
            let _ = write!(
                out,
                "<tr><th scope=\"row\">{}</th><td><code>{}</code></td></tr>",
                text(name),
                text(&cut(&shown, 2000))
            );
        }
        out.push_str("</tbody></table>");
    }
    out.push_str(&time_left(left));
    let _ = write!(
        out,
        "<form method=\"post\" action=\"{base}/approvals/{id}\">{csrf}\
         <div class=\"actions\"><button type=\"submit\" name=\"answer\" value=\"once\" class=\"yes\">Allow once</button>\
         <button type=\"submit\" name=\"answer\" value=\"deny\" class=\"no\">Deny</button></div>",
        csrf = csrf_field(csrf).into_string()
    );
    if !can_remember && approval.microphone.is_some() && approval.agent_id.is_some() {
        out.push_str(
            "<p class=\"note\">A yes to open a microphone is remembered only where one of \
             your rules allows the call explicitly.</p>",
        );
    }
    if can_remember {
        let _ = write!(
            out,
            "<details><summary>Allow and remember</summary>\
             <label for=\"a{id}-scope\">For</label><select name=\"scope\" id=\"a{id}-scope\">\
             <option value=\"arguments\">this agent, this tool, exactly this input</option>\
             <option value=\"capability\">this agent, this capability, any input</option></select>\
             <label for=\"a{id}-minutes\">Minutes</label>\
             <input type=\"number\" name=\"minutes\" id=\"a{id}-minutes\" value=\"10\" min=\"1\" max=\"1440\">\
             <button type=\"submit\" name=\"answer\" value=\"remember\">Allow and remember</button></details>"
        );
    }
    out.push_str("</form></article>");
    out
}
