//! The console's pages, rendered on the server from the admin API's own
//! bodies (`dk_proto::admin`). Every text that came from a device, an
//! agent or the log goes through `html::text` or `html::attr`; nothing
//! else is written unescaped but this file's own markup.

use std::fmt::Write as _;

use dk_proto::admin as api;
use serde_json::Value;

use serde::Deserialize;

use super::html::{attr, own, push_text, segment, text};
use crate::link::DeviceEvent;
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

/// Which page is shown, for the navigation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Page {
    Prompts,
    Devices,
    Agents,
    Audit,
    Status,
}

/// What every page's frame shows.
pub(crate) struct Frame {
    /// `/console/<secret>`: every page's links start with it.
    pub(crate) base: String,
    pub(crate) current: Page,
    pub(crate) pending: usize,
    pub(crate) csrf: String,
    /// The session's id, as the audit log names it (not its cookie).
    pub(crate) session: String,
    /// The microphones open now, for the banner every page shows.
    pub(crate) microphones: Vec<api::LiveMicrophone>,
}

/// A device event kept for the device's page.
#[derive(Debug, Clone)]
pub(crate) struct RecentEvent {
    pub(crate) device_id: String,
    pub(crate) capability: String,
    pub(crate) at_ms: u64,
    pub(crate) data: String,
}

/// Longest event data kept for a device's page, in characters.
const EVENT_TEXT: usize = 300;

impl RecentEvent {
    pub(crate) fn of(event: &DeviceEvent) -> RecentEvent {
        let data = event.data.as_deref().map_or("", |d| d.get());
        RecentEvent {
            device_id: event.device_id.clone(),
            capability: event.capability.clone(),
            at_ms: crate::store::epoch_ms(std::time::SystemTime::now()),
            data: cut(data, EVENT_TEXT),
        }
    }
}

/// An agent just added: its credential, shown this once.
pub(crate) struct Added {
    pub(crate) name: String,
    pub(crate) credential: String,
    pub(crate) mcp_url: String,
}

/// The result of verifying the audit chain.
pub(crate) struct Verified {
    pub(crate) entries: u64,
    pub(crate) problems: Vec<String>,
}

fn cut(value: &str, most: usize) -> String {
    match value.char_indices().nth(most) {
        Some((end, _)) => format!("{}…", &value[..end]),
        None => value.to_owned(),
    }
}

/// `ms` since the epoch as `YYYY-MM-DD HH:MM:SS` UTC.
pub(crate) fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rest = secs % 86_400;
    // Days to a civil date (proleptic Gregorian), after H. Hinnant.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

fn now_ms() -> u64 {
    crate::store::epoch_ms(std::time::SystemTime::now())
}

/// A page's whole document around `main`.
fn layout(frame: &Frame, title: &str, main: &str) -> String {
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

fn csrf_field(csrf: &str) -> String {
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
    layout(frame, "Waiting", &main)
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

fn kind_label(capability: &api::DeviceCapability) -> &'static str {
    match (capability.kind.as_str(), capability.confirm) {
        (_, true) => "asks every time",
        ("sensor", false) => "sensor",
        _ => "actuator",
    }
}

/// A capability's or an event's details under its name: the device's
/// claims (its annotations, said to be claims) and each param with its
/// bounds in words.
fn details(claims: &[String], params: &[api::DeviceParam]) -> String {
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
        csrf = csrf_field(csrf)
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
        csrf = csrf_field(csrf)
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
        return layout(frame, "Devices", &main);
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
    layout(frame, "Devices", &main)
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
            csrf = csrf_field(&frame.csrf),
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
        csrf = csrf_field(&frame.csrf),
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
    layout(frame, &device.name, &main)
}

/// The agents page: each agent with its scope and role, forms to change
/// the scope or remove it, a form to add one; after adding, the new
/// credential, shown this once, with the MCP configuration to paste.
pub(crate) fn agents(frame: &Frame, agents: &[api::Agent], added: Option<&Added>) -> String {
    let base = &frame.base;
    let mut main = String::from("<h1>Agents</h1>");
    if let Some(added) = added {
        let config = serde_json::json!({
            "mcpServers": {"dk": {
                "type": "http",
                "url": added.mcp_url,
                "headers": {"Authorization": format!("Bearer {}", added.credential)},
            }}
        });
        let config = serde_json::to_string_pretty(&config).unwrap_or_default();
        let _ = write!(
            main,
            "<section class=\"added\" aria-labelledby=\"added-title\"><h2 id=\"added-title\">{name} was added</h2>\
             <p>Its credential is shown this once: copy it now.</p>\
             <p><code id=\"credential\">{credential}</code> \
             <button type=\"button\" data-copy=\"credential\">Copy credential</button></p>\
             <p>An MCP client's configuration:</p><pre id=\"mcp-config\">{config}</pre>\
             <button type=\"button\" data-copy=\"mcp-config\">Copy configuration</button></section>",
            name = text(&added.name),
            credential = text(&added.credential),
            config = own(&config),
        );
    }
    if agents.is_empty() {
        main.push_str("<p>No agent may call tools yet.</p>");
    } else {
        main.push_str("<ul class=\"agents\">");
        for agent in agents {
            let scope = agent.scope.join(", ");
            let _ = write!(
                main,
                "<li><h2>{name}</h2><p>Role {role}, added {added}. Scope: {scope_text}</p>\
                 <form method=\"post\" action=\"{base}/agents/{href}/scope\">{csrf}\
                 <label for=\"scope-{id}\">Scope (devices, or device:capability, comma separated)</label>\
                 <input type=\"text\" name=\"scope\" id=\"scope-{id}\" value=\"{scope}\">\
                 <button type=\"submit\">Change scope</button></form>\
                 <form method=\"post\" action=\"{base}/agents/{href}/remove\" data-confirm=\"Remove agent {confirm}?\">{csrf}\
                 <button type=\"submit\" class=\"no\">Remove {name}</button></form></li>",
                name = text(&agent.name),
                role = text(agent.role.as_str()),
                added = utc(agent.added_at_ms),
                scope_text = if scope.is_empty() {
                    "nothing".to_owned()
                } else {
                    text(&scope)
                },
                href = segment(&agent.name),
                id = attr(&agent.name),
                scope = attr(&scope),
                confirm = attr(&agent.name),
                csrf = csrf_field(&frame.csrf),
            );
        }
        main.push_str("</ul>");
    }
    let _ = write!(
        main,
        "<h2>Add an agent</h2><form method=\"post\" action=\"{base}/agents\" class=\"add\">{csrf}\
         <label for=\"new-name\">Name</label><input type=\"text\" name=\"name\" id=\"new-name\" required>\
         <label for=\"new-scope\">Scope (devices, or device:capability, comma separated)</label>\
         <input type=\"text\" name=\"scope\" id=\"new-scope\">\
         <label for=\"new-role\">Role</label><select name=\"role\" id=\"new-role\">\
         <option value=\"user\">user: sensors and actuators in scope</option>\
         <option value=\"guest\">guest: sensors only</option>\
         <option value=\"admin\">admin</option></select>\
         <button type=\"submit\">Add agent</button></form>",
        csrf = csrf_field(&frame.csrf)
    );
    layout(frame, "Agents", &main)
}

/// Who decided an entry, as its row says it: for a decision, the rule,
/// the person (and through which front end), a remembered yes, or the
/// grants and checks alone; for a change, the front end that made it.
fn decided_by(entry: &AuditEntry) -> String {
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

fn audit_table(out: &mut String, entries: &[AuditEntry]) {
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
        csrf = csrf_field(&frame.csrf),
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
    layout(frame, "Audit log", &main)
}

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
    layout(frame, "Status", &main)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::{decided_by, utc};
    use crate::store::AuditEntry;

    #[track_caller]
    fn check(kind: &str, entry: Value, expected: &str) {
        let entry = AuditEntry {
            seq: 1,
            at_ms: 0,
            kind: kind.to_owned(),
            entry,
            prev_hash: String::new(),
            hash: String::new(),
        };
        assert_eq!(decided_by(&entry), expected);
    }

    #[test]
    fn an_audit_row_says_who_decided() {
        let console = json!({"frontEnd": "console", "session": "ab12"});
        check(
            "decision",
            json!({"allowed": true, "rule": "night <b>"}),
            "rule <code>night &lt;b&gt;</code>",
        );
        check(
            "decision",
            json!({"allowed": true, "rule": null}),
            "the grants",
        );
        check("decision", json!({"allowed": false}), "the checks");
        check(
            "decision",
            json!({"allowed": true, "person": "approved", "by": console}),
            "the person, in the console",
        );
        check(
            "decision",
            json!({"allowed": false, "person": "refused", "by": {"frontEnd": "terminal"}}),
            "the person, on the terminal",
        );
        check(
            "decision",
            json!({"allowed": false, "person": "refused"}),
            "the person",
        );
        check(
            "decision",
            json!({"allowed": true, "person": "remembered", "allowance": {"id": 4}}),
            "a remembered yes (allowance 4)",
        );
        check(
            "decision",
            json!({"allowed": true, "caller": "person"}),
            "the person's own call",
        );
        check(
            "granted",
            json!({"by": {"frontEnd": "adminApi"}}),
            "the person, through the admin API",
        );
        check("granted", json!({}), "");
    }

    #[test]
    fn times_read_as_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(utc(1_796_185_507_000), "2026-12-02 04:25:07");
    }
}
