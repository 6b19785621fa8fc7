//! The waiting page: each open prompt (a pairing, an approval) as a card
//! with its forms, also sent alone on the live feed.

use dk_proto::admin as api;
use maud::{Markup, html};
use serde_json::Value;

use super::frame::{csrf_field, layout};
use super::shared::{Frame, cut, now_ms, utc};
use crate::console::html::{Attr, Text};

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
    let main = html! {
        h1 { "Waiting for you" }
        p id="none" hidden[!pending.is_empty()] {
            "Nothing is waiting. New pairings and approvals appear here as they come."
        }
        div id="prompts" {
            @for prompt in pending { (card(prompt, &frame.base, &frame.csrf)) }
        }
    };
    layout(frame, "Waiting", main)
}

/// One prompt's card, with its forms.
pub(crate) fn prompt_card(pending: &api::Pending, base: &str, csrf: &str) -> String {
    card(pending, base, csrf).into_string()
}

/// [`prompt_card`]'s markup.
fn card(pending: &api::Pending, base: &str, csrf: &str) -> Markup {
    let left = pending.expires_at_ms.saturating_sub(now_ms());
    match &pending.prompt {
        api::Prompt::Consent(consent) => consent_card(pending.id, consent, left, base, csrf),
        api::Prompt::Approval(approval) => {
            approval_card(pending.id, approval, pending.can_remember, left, base, csrf)
        }
    }
}

fn time_left(left_ms: u64) -> Markup {
    let secs = left_ms / 1000;
    html! {
        p class="left" {
            "Time left: "
            span data-left-ms=(left_ms) { (secs / 60) ":" (format!("{:02}", secs % 60)) }
            " (then it is a no)"
        }
    }
}

pub(super) fn kind_label(capability: &api::DeviceCapability) -> &'static str {
    match (capability.kind, capability.confirm) {
        (_, true) => "asks every time",
        (kind, false) => kind.as_str(),
    }
}

/// A capability's or an event's details under its name: the device's
/// claims (its annotations, said to be claims) and each param with its
/// bounds in words.
pub(super) fn details(claims: &[String], params: &[api::DeviceParam]) -> Markup {
    html! {
        @if !claims.is_empty() {
            span class="claims" { "the device claims: " (Text(&claims.join(", "))) }
        }
        @if !params.is_empty() {
            ul class="params" {
                @for param in params {
                    li {
                        code { (Text(&param.name)) } ": " (Text(&param.ty))
                        @if param.required { ", required" }
                        @if let Some(bounds) = &param.bounds { ", " (Text(bounds)) }
                    }
                }
            }
        }
    }
}

fn consent_card(
    id: u64,
    consent: &api::ConsentRequest,
    left: u64,
    base: &str,
    csrf: &str,
) -> Markup {
    let spoken: Vec<String> = consent.code.chars().map(String::from).collect();
    let credential = consent.replaces.as_ref().and_then(|old| old.credential);
    html! {
        article class="prompt pairing" id={ "prompt-" (id) } aria-labelledby={ "prompt-" (id) "-title" } {
            h2 id={ "prompt-" (id) "-title" } { "Pair " (Text(&consent.name)) }
            p class="meta" { "Device " code { (Text(&consent.device_id)) } ", kind " (Text(&consent.kind)) }
            @if consent.no_screen {
                p class="warning" role="note" {
                    "This device says it has no screen: no code proves it is the one in front of you. \
                     Pair it only if you just started it yourself."
                }
            } @else {
                p { "Check that the device shows this code:" }
                p class="code" aria-label={ "code " (Attr(&spoken.join(" "))) } { (Text(&consent.code)) }
            }
            @if consent.channel.is_encrypted() {
                p class="channel ok" { "Channel: encrypted (dk/2)" }
            } @else {
                p class="channel warn" { "Channel: not encrypted (v1)" }
            }
            @if let Some(change) = credential {
                p class="warning" role="alert" {
                    "Warning: " (Text(change.words())) ". The code proves which device is asking now, \
                     not that it is the one paired before."
                }
            }
            @if let Some(old) = &consent.replaces {
                div class="replaces" role="note" {
                    p {
                        "This replaces the pairing made " (utc(old.paired_at_ms)) " (grants now: "
                        @if old.grants.is_empty() { "none" } @else { (Text(&old.grants.join(", "))) }
                        ")."
                    }
                    @if let Some(was) = &old.was_name { p { "It was named " (Text(was)) "." } }
                    @if let Some(was) = &old.was_kind { p { "It was of kind " (Text(was)) "." } }
                    @if !old.changes.is_empty() {
                        ul { @for change in &old.changes { li { (Text(&change.summary)) } } }
                    }
                }
            }
            (time_left(left))
            form method="post" action={ (base) "/pairings/" (id) } {
                (csrf_field(csrf))
                fieldset {
                    legend { "Allow" }
                    @for (n, capability) in consent.capabilities.iter().enumerate() {
                        @let input_id = format!("p{id}-c{n}");
                        @let label = kind_label(capability);
                        div class="check" {
                            input type="checkbox" name="grant" value=(Attr(&capability.name)) id=(input_id);
                            label for=(input_id) {
                                strong { (Text(&capability.name)) }
                                @if let Some(title) = &capability.title { " " em { (Text(title)) } }
                                " "
                                span class={ "tag " (label.replace(' ', "-")) } { (label) }
                                span class="description" { (Text(&capability.description)) }
                                (details(&capability.claims, &capability.params))
                            }
                        }
                    }
                    @for (n, event) in consent.events.iter().enumerate() {
                        @let input_id = format!("p{id}-e{n}");
                        div class="check" {
                            input type="checkbox" name="grant" value=(Attr(&event.name)) id=(input_id);
                            label for=(input_id) {
                                strong { (Text(&event.name)) }
                                " "
                                span class="tag event" { "event" }
                                span class="description" { (Text(&event.description)) }
                                (details(&[], &event.params))
                            }
                        }
                    }
                }
                @if consent.no_screen {
                    div class="check" {
                        input type="checkbox" name="without_code" value="yes" id={ "p" (id) "-nocode" };
                        label for={ "p" (id) "-nocode" } {
                            "I started this device myself and pair it without a code"
                        }
                    }
                }
                @if let Some(change) = credential {
                    div class="check" {
                        input type="checkbox" name="credential_change" value="yes" id={ "p" (id) "-change" };
                        label for={ "p" (id) "-change" } {
                            "I know "
                            (match change {
                                api::CredentialChange::KeyChanged => "its key changed",
                                api::CredentialChange::EncryptionDropped => "it drops encryption",
                            })
                            " and pair it anyway"
                        }
                    }
                }
                div class="actions" {
                    button type="submit" name="answer" value="pair" class="yes" { "Pair, allowing what is ticked" }
                    button type="submit" name="answer" value="refuse" class="no" { "Refuse" }
                }
            }
        }
    }
}

fn approval_card(
    id: u64,
    approval: &api::ApprovalRequest,
    can_remember: bool,
    left: u64,
    base: &str,
    csrf: &str,
) -> Markup {
    html! {
        article class="prompt approval" id={ "prompt-" (id) } aria-labelledby={ "prompt-" (id) "-title" } {
            h2 id={ "prompt-" (id) "-title" } {
                @match &approval.agent_id {
                    Some(agent) => { "Agent " strong { (Text(agent)) } }
                    None => "A call",
                }
                " asks to use " (Text(&approval.device_id)) ": " (Text(&approval.capability))
            }
            dl class="facts" {
                dt { "Tool" }
                dd { code { (Text(&approval.tool)) } }
                @if let Some(session) = &approval.session_id {
                    dt { "Session" }
                    dd { code { (Text(session)) } }
                }
                @if let Some(microphone) = &approval.microphone {
                    dt { "Microphone" }
                    dd class="microphone-ask" {
                        strong { "opens the microphone " (Text(&microphone.words())) }
                    }
                }
                dt { "Why you are asked" }
                dd { (Text(&approval.reason)) }
                dt { "Channel" }
                dd {
                    @if approval.channel.is_encrypted() { "encrypted (dk/2)" } @else { "not encrypted (v1)" }
                }
            }
            @if approval.input.is_empty() {
                p { "No input." }
            } @else {
                table class="input" {
                    caption { "Input" }
                    tbody {
                        @for (name, value) in &approval.input {
                            @let shown = match value {
                                Value::String(s) => format!("\"{s}\""),
                                other => other.to_string(),
                            };
                            tr {
                                th scope="row" { (Text(name)) }
                                td { code { (Text(&cut(&shown, 2000))) } }
                            }
                        }
                    }
                }
            }
            (time_left(left))
            form method="post" action={ (base) "/approvals/" (id) } {
                (csrf_field(csrf))
                div class="actions" {
                    button type="submit" name="answer" value="once" class="yes" { "Allow once" }
                    button type="submit" name="answer" value="deny" class="no" { "Deny" }
                }
                @if !can_remember && approval.microphone.is_some() && approval.agent_id.is_some() {
                    p class="note" {
                        "A yes to open a microphone is remembered only where one of \
                         your rules allows the call explicitly."
                    }
                }
                @if can_remember {
                    details {
                        summary { "Allow and remember" }
                        label for={ "a" (id) "-scope" } { "For" }
                        select name="scope" id={ "a" (id) "-scope" } {
                            option value="arguments" { "this agent, this tool, exactly this input" }
                            option value="capability" { "this agent, this capability, any input" }
                        }
                        label for={ "a" (id) "-minutes" } { "Minutes" }
                        input type="number" name="minutes" id={ "a" (id) "-minutes" } value="10" min="1" max="1440";
                        button type="submit" name="answer" value="remember" { "Allow and remember" }
                    }
                }
            }
        }
    }
}
