//! The audit log's pages: filters, a page of entries newest first, the
//! chain's head and a verification's result.

use std::fmt::Write as _;

use maud::PreEscaped;
use serde::Deserialize;
use serde_json::Value;

use super::frame::{csrf_field, layout};
use super::{Frame, cut, utc};
use crate::console::html::{attr, push_text, segment, text};
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

pub(super) fn audit_table(out: &mut String, entries: &[AuditEntry]) {
    if entries.is_empty() {
        out.push_str("<p>No entries.</p>");
        return;
    }
    out.push_str(
        "<table class=\"audit\"><thead><tr><th scope=\"col\">#</th><th scope=\"col\">When (UTC)</th>\
         <th scope=\"col\">What</th><th scope=\"col\">Decided by</th><th scope=\"col\">Details</th>\
         </tr></thead><tbody>",
    );
    for entry in entries {
        let field = |name: &str| entry.entry.get(name).and_then(Value::as_str);
        let mut what = text(&entry.kind);
        if entry.kind == kinds::DECISION {
            let allowed = entry.entry.get(fields::ALLOWED).and_then(Value::as_bool) == Some(true);
            what = if allowed {
                "<span class=\"state on\">allowed</span>".to_owned()
            } else {
                "<span class=\"state off\">refused</span>".to_owned()
            };
        }
        let by = decided_by(entry);
        let _ = write!(
            out,
            "<tr><td class=\"seq\">{}</td><td class=\"when\">{}</td><td class=\"what\">{what}</td>\
             <td class=\"by\">{}{by}</td><td class=\"details\">",
            entry.seq,
            utc(entry.at_ms),
            if by.is_empty() {
                ""
            } else {
                "<span class=\"label\">by </span>"
            },
        );
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
        for (class, parts) in lines {
            if parts.iter().all(|(_, value)| value.is_none()) {
                continue;
            }
            let _ = write!(out, "<span class=\"{class}\">");
            for (label, value) in parts.iter().filter_map(|(l, v)| v.map(|v| (l, v))) {
                if !label.is_empty() {
                    let _ = write!(out, "{label} ");
                }
                out.push_str("<code>");
                push_text(out, &cut(value, 300));
                out.push_str("</code> ");
            }
            out.push_str("</span> ");
        }
        out.push_str("<details><summary>Entry</summary><pre>");
        push_text(out, &cut(&entry.entry.to_string(), 4000));
        out.push_str("</pre></details></td></tr>");
    }
    out.push_str("</tbody></table>");
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
    let mut main = String::from("<h1>Audit log</h1>");
    if let Some(verified) = verified {
        if verified.problems.is_empty() {
            let _ = write!(
                main,
                "<p class=\"verified ok\" role=\"status\">Verified: {} entries, the chain is intact and \
                 accounts for every pairing, grant and agent.</p>",
                verified.entries
            );
        } else {
            let _ = write!(
                main,
                "<div class=\"verified bad\" role=\"alert\"><p>Verification found {} problems:</p><ul>",
                verified.problems.len()
            );
            for problem in &verified.problems {
                let _ = write!(main, "<li>{}</li>", text(problem));
            }
            main.push_str("</ul></div>");
        }
    }
    if let Some(head) = head {
        let _ = write!(
            main,
            "<p class=\"head\">Head: entry {} <code>{}</code></p>",
            head.seq,
            text(&head.hash)
        );
    }
    let value = |v: &Option<String>| attr(v.as_deref().unwrap_or(""));
    let decision = filter.decision.as_deref().unwrap_or("");
    let selected = |v: &str| if v == decision { " selected" } else { "" };
    let _ = write!(
        main,
        "<form method=\"post\" action=\"{base}/audit/verify\">{csrf}<button type=\"submit\">Verify the chain</button></form>\
         <form method=\"get\" action=\"{base}/audit\" class=\"filters\">\
         <label for=\"f-device\">Device</label><input type=\"text\" name=\"device\" id=\"f-device\" value=\"{device}\">\
         <label for=\"f-agent\">Agent</label><input type=\"text\" name=\"agent\" id=\"f-agent\" value=\"{agent}\">\
         <label for=\"f-decision\">Decision</label><select name=\"decision\" id=\"f-decision\">\
         <option value=\"\"{any}>any entry</option><option value=\"allowed\"{allowed}>allowed calls</option>\
         <option value=\"refused\"{refused}>refused calls</option></select>\
         <button type=\"submit\">Filter</button></form>",
        csrf = csrf_field(&frame.csrf).into_string(),
        device = value(&filter.device),
        agent = value(&filter.agent),
        any = selected(""),
        allowed = selected("allowed"),
        refused = selected("refused"),
    );
    audit_table(&mut main, entries);
    let keep = |v: &Option<String>| segment(v.as_deref().unwrap_or(""));
    let filters = format!(
        "device={}&amp;agent={}&amp;decision={}",
        keep(&filter.device),
        keep(&filter.agent),
        segment(decision)
    );
    main.push_str("<nav aria-label=\"Pages\" class=\"pages\">");
    if filter.before.is_some() {
        let _ = write!(main, "<a href=\"{base}/audit?{filters}\">Newest</a> ");
    }
    if entries.len() == AUDIT_PAGE
        && let Some(last) = entries.last()
    {
        let _ = write!(
            main,
            "<a href=\"{base}/audit?{filters}&amp;before={}\" rel=\"next\">Older</a>",
            last.seq
        );
    }
    main.push_str("</nav>");
    layout(frame, "Audit log", PreEscaped(main))
}
