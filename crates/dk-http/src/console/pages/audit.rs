//! The audit log's pages: filters, a page of entries newest first, the
//! chain's head and a verification's result.

use maud::{Markup, PreEscaped, html};
use serde::Deserialize;
use serde_json::Value;

use super::frame::{csrf_field, layout};
use super::shared::{Frame, cut, utc};
use crate::console::html::{Attr, Text, segment, text};
use crate::store::entry::{By, Caller, Entry, FrontEnd, PersonAnswer, fields, kinds};
use crate::store::{AuditEntry, AuditHead, AuditQuery};

/// Audit entries on one page.
pub(crate) const AUDIT_PAGE: usize = 50;

/// The audit page's filters, as the query string gives them.
#[derive(Deserialize, Default)]
pub(crate) struct AuditFilter {
    /// Only entries naming this device.
    pub(crate) device: Option<String>,
    /// Only entries naming this agent.
    pub(crate) agent: Option<String>,
    /// `allowed` or `refused` decisions only.
    pub(crate) decision: Option<String>,
    /// Only entries before this position.
    pub(crate) before: Option<u64>,
}

impl AuditFilter {
    /// The store's query for one page of these entries.
    pub(crate) fn query(&self) -> AuditQuery {
        let given = |v: &Option<String>| v.clone().filter(|s| !s.is_empty());
        AuditQuery {
            before_seq: self.before,
            device_id: given(&self.device),
            agent_id: given(&self.agent),
            allowed: match self.decision.as_deref() {
                Some("allowed") => Some(true),
                Some("refused") => Some(false),
                _ => None,
            },
            limit: AUDIT_PAGE,
        }
    }
}

/// The result of verifying the audit chain.
pub(crate) struct Verified {
    pub(crate) entries: u64,
    pub(crate) problems: Vec<String>,
}

/// Who decided an entry, as its row says it: for a decision, the rule,
/// the person (and through which front end), a remembered yes, or the
/// grants and checks alone; for a change, the front end that made it.
pub(super) fn decided_by(entry: &AuditEntry) -> String {
    let front_end = entry
        .entry
        .get(fields::BY)
        .and_then(|by| By::deserialize(by).ok())
        .map(|by| match by.front_end {
            FrontEnd::Console => "in the console",
            FrontEnd::Terminal => "on the terminal",
            FrontEnd::AdminApi => "through the admin API",
        });
    let person = |front_end: Option<&str>| match front_end {
        Some(place) => format!("the person, {place}"),
        None => "the person".to_owned(),
    };
    if entry.kind != kinds::DECISION {
        return match front_end {
            Some(_) => person(front_end),
            None => String::new(),
        };
    }
    let Ok(Entry::Decision(decision)) = Entry::read(&entry.kind, &entry.entry) else {
        return "the checks".to_owned();
    };
    match decision.person {
        Some(PersonAnswer::Remembered) => match decision.allowance {
            Some(allowance) => format!("a remembered yes (allowance {})", allowance.id),
            None => "a remembered yes".to_owned(),
        },
        Some(_) => person(front_end),
        None => match decision.rule {
            Some(rule) => format!("rule <code>{}</code>", text(&cut(&rule, 80))),
            None if decision.caller == Some(Caller::Person) => "the person's own call".to_owned(),
            None if decision.allowed => "the grants".to_owned(),
            None => "the checks".to_owned(),
        },
    }
}

/// A value an audit row names, with its label (none for the reason).
type Named<'a> = (&'a str, Option<&'a str>);

/// A page of the log as a table, or a line saying it holds no entry.
pub(super) fn audit_table(entries: &[AuditEntry]) -> Markup {
    if entries.is_empty() {
        return html! { p { "No entries." } };
    }
    html! {
        table class="audit" {
            thead {
                tr {
                    th scope="col" { "#" }
                    th scope="col" { "When (UTC)" }
                    th scope="col" { "What" }
                    th scope="col" { "Decided by" }
                    th scope="col" { "Details" }
                }
            }
            tbody { @for entry in entries { (audit_row(entry)) } }
        }
    }
}

/// One entry's row.
fn audit_row(entry: &AuditEntry) -> Markup {
    let field = |name: &str| entry.entry.get(name).and_then(Value::as_str);
    let allowed = entry.entry.get(fields::ALLOWED).and_then(Value::as_bool) == Some(true);
    let by = decided_by(entry);
    // What it names, in lines a phone shows one each: the device and
    // agent, the tool, and why (an allowed call's reason says nothing
    // more than its outcome).
    let reason = field(fields::REASON).filter(|r| *r != "allowed");
    let lines: [(&str, &[Named<'_>]); 3] = [
        (
            "names",
            &[
                ("device", field(fields::DEVICE_ID)),
                ("agent", field(fields::AGENT_ID)),
            ],
        ),
        ("tool", &[("tool", field(fields::TOOL))]),
        ("reason", &[("", reason)]),
    ];
    html! {
        tr {
            td class="seq" { (entry.seq) }
            td class="when" { (utc(entry.at_ms)) }
            td class="what" {
                @if entry.kind != kinds::DECISION {
                    (Text(&entry.kind))
                } @else if allowed {
                    span class="state on" { "allowed" }
                } @else {
                    span class="state off" { "refused" }
                }
            }
            td class="by" {
                @if !by.is_empty() { span class="label" { "by " } }
                // decided_by's own markup, its values escaped there.
                (PreEscaped(&by))
            }
            td class="details" {
                @for (class, parts) in lines {
                    @if parts.iter().any(|(_, value)| value.is_some()) {
                        span class=(class) {
                            @for (label, value) in parts.iter().filter_map(|(l, v)| v.map(|v| (l, v))) {
                                @if !label.is_empty() { (label) " " }
                                code { (Text(&cut(value, 300))) }
                                " "
                            }
                        }
                        " "
                    }
                }
                details {
                    summary { "Entry" }
                    pre { (Text(&cut(&entry.entry.to_string(), 4000))) }
                }
            }
        }
    }
}

/// The audit log: filters, a page of entries newest first, the link to
/// the next older page, the head, and the result of a verification.
pub(crate) fn audit(
    frame: &Frame,
    filter: &AuditFilter,
    entries: &[AuditEntry],
    head: Option<&AuditHead>,
    verified: Option<&Verified>,
) -> String {
    let base = &frame.base;
    let value = |v: &Option<String>| v.clone().unwrap_or_default();
    let decision = filter.decision.as_deref().unwrap_or("");
    let keep = |v: &Option<String>| segment(v.as_deref().unwrap_or(""));
    let filters = format!(
        "device={}&agent={}&decision={}",
        keep(&filter.device),
        keep(&filter.agent),
        segment(decision)
    );
    let main = html! {
        h1 { "Audit log" }
        @if let Some(verified) = verified {
            @if verified.problems.is_empty() {
                p class="verified ok" role="status" {
                    "Verified: " (verified.entries) " entries, the chain is intact and \
                     accounts for every pairing, grant and agent."
                }
            } @else {
                div class="verified bad" role="alert" {
                    p { "Verification found " (verified.problems.len()) " problems:" }
                    ul { @for problem in &verified.problems { li { (Text(problem)) } } }
                }
            }
        }
        @if let Some(head) = head {
            p class="head" { "Head: entry " (head.seq) " " code { (Text(&head.hash)) } }
        }
        form method="post" action={ (base) "/audit/verify" } {
            (csrf_field(&frame.csrf))
            button type="submit" { "Verify the chain" }
        }
        form method="get" action={ (base) "/audit" } class="filters" {
            label for="f-device" { "Device" }
            input type="text" name="device" id="f-device" value=(Attr(&value(&filter.device)));
            label for="f-agent" { "Agent" }
            input type="text" name="agent" id="f-agent" value=(Attr(&value(&filter.agent)));
            label for="f-decision" { "Decision" }
            select name="decision" id="f-decision" {
                option value="" selected[decision.is_empty()] { "any entry" }
                option value="allowed" selected[decision == "allowed"] { "allowed calls" }
                option value="refused" selected[decision == "refused"] { "refused calls" }
            }
            button type="submit" { "Filter" }
        }
        (audit_table(entries))
        nav aria-label="Pages" class="pages" {
            @if filter.before.is_some() {
                a href={ (base) "/audit?" (filters) } { "Newest" }
                " "
            }
            @if entries.len() == AUDIT_PAGE && let Some(last) = entries.last() {
                a href={ (base) "/audit?" (filters) "&before=" (last.seq) } rel="next" { "Older" }
            }
        }
    };
    layout(frame, "Audit log", main)
}
