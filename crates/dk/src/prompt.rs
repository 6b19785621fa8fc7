//! The terminal prompt: shows the person each pairing request and approval
//! as it arrives and reads the answer from standard input. Prompts answered
//! elsewhere (the admin API) leave the queue here too.
//!
//! Every prompt shows its number and every answer must start with it
//! (`7 y`, `7 args 30`, `12 1,3`): an answer goes to the request it names, or nowhere, so
//! a request that changed on screen while the person typed (the first one
//! withdrawn, answered elsewhere or timed out) never receives an answer meant
//! for another.
//!
//! An approval of an agent's call is answered `y` (once), `args N` (this
//! agent, this tool, exactly these arguments, for N minutes), `cap N` (this
//! agent, any call of this capability, for N minutes) or `n`; anything else
//! is refused with a message and the question stays open.
//!
//! While a voice device's microphone is open the terminal says so, and says
//! again when it closes; `stop` (alone on a line) is the person's stop of
//! every microphone open.
//!
//! Everything a device wrote is shown through [`printable`], so a manifest or
//! an input value cannot drive the terminal.

use std::collections::VecDeque;
use std::future::Future;
use std::io::BufRead;
use std::sync::Arc;

use dk_core::adapter::ApprovalRequest;
use dk_core::allowances::{
    Allowance, AllowanceMinutes, AllowanceScope, DEFAULT_ALLOWANCE_MINUTES, Remember,
};
use dk_core::by::By;
use dk_core::person::{ApprovalAnswer, PendingPrompt, PersonEvent, Prompt};
use dk_core::registry::{ChangeKind, ConsentDecision, ConsentRequest, CredentialChange, Replaced};
use dk_vessel::Vessel;
use tokio::sync::mpsc;

use crate::input::{channel_words, printable};

/// What the person types before the grant to pair a device whose key
/// changed or that drops encryption, knowingly.
const CONFIRM_CHANGE: &str = "pair anyway:";

/// Reads lines from standard input on a thread of its own (a blocking read
/// cannot be cancelled; the thread ends with the process).
fn stdin_lines() -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel(16);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.blocking_send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Runs the prompt until `stop` resolves.
pub async fn run(vessel: Arc<Vessel>, stop: impl Future<Output = ()>) {
    let mut events = vessel.person().subscribe();
    let mut lines = stdin_lines();
    let mut queue: VecDeque<PendingPrompt> = vessel.person().pending().into();
    if let Some(first) = queue.front() {
        show(first);
    }
    let mut microphones = vessel.microphones().watch();
    let mut live = show_microphones(&vessel, &[]);
    tokio::pin!(stop);
    // Once standard input ends, prompts are answered elsewhere; the loop
    // still follows them and still ends when asked to stop.
    let mut reading = true;
    loop {
        tokio::select! {
            () = &mut stop => return,
            changed = microphones.changed() => {
                if changed.is_err() {
                    std::future::pending::<()>().await;
                }
                live = show_microphones(&vessel, &live);
            }
            event = events.recv() => match event {
                Ok(PersonEvent::Asked(prompt)) => {
                    queue.push_back(prompt);
                    if queue.len() == 1 && let Some(first) = queue.front() {
                        show(first);
                    }
                }
                Ok(PersonEvent::Closed { id }) => {
                    let was_current = queue.front().is_some_and(|p| p.id == id);
                    queue.retain(|p| p.id != id);
                    if was_current {
                        println!("(closed: answered elsewhere, withdrawn or timed out)");
                        if let Some(first) = queue.front() {
                            show(first);
                        }
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    queue = vessel.person().pending().into();
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            },
            line = lines.recv(), if reading => {
                let Some(line) = line else {
                    reading = false;
                    println!("(standard input closed: answer with `dk pairings` and `dk approvals`)");
                    continue;
                };
                if line.trim().is_empty() {
                    continue;
                }
                if line.trim() == "stop" {
                    stop_microphones(&vessel).await;
                    continue;
                }
                match answer_named(&vessel, &queue, &line).await {
                    Ok(id) => {
                        // Answered here: its closing event is not news.
                        let was_current = queue.front().is_some_and(|p| p.id == id);
                        queue.retain(|p| p.id != id);
                        if was_current && let Some(next) = queue.front() {
                            show(next);
                        }
                    }
                    Err(why) => {
                        println!("{why}");
                        if let Some(current) = queue.front() {
                            show(current);
                        }
                    }
                }
            }
        }
    }
}

/// Shows a prompt: what is asked, and how to answer it.
fn show(prompt: &PendingPrompt) {
    println!();
    match &prompt.prompt {
        Prompt::Consent(request) => show_consent(prompt.id, request),
        Prompt::Approval(request) => show_approval(prompt, request),
    }
}

/// A pairing request: the device, the pairing it replaces, what proves it
/// is the device in front of the person, what it declares, and how to answer.
fn show_consent(id: u64, request: &ConsentRequest) {
    println!("== #{id} A device asks to pair ==");
    println!(
        "  device   {} ({}), kind {}",
        printable(&request.name),
        request.device_id,
        printable(&request.kind)
    );
    println!("  channel  {}", channel_words(request.channel));
    if let Some(old) = &request.replaces {
        show_replaced(old);
    }
    let credential = request.replaces.as_ref().and_then(|old| old.credential);
    show_proof(request, credential);
    show_capabilities(request);
    show_events(request);
    ask_consent(id, request, credential);
}

/// The pairing a request replaces: when it was made, what it grants, and
/// what changed since.
fn show_replaced(old: &Replaced) {
    let grants = if old.grants.is_empty() {
        "nothing".to_owned()
    } else {
        old.grants.join(", ")
    };
    println!(
        "  NOTE     a device is already paired under this id ({}, granted: {grants}); this replaces it and its grants",
        crate::input::ago(old.paired_at_ms)
    );
    if let Some(name) = &old.was_name {
        println!("  CHANGED  its name was {}", printable(name));
    }
    if let Some(kind) = &old.was_kind {
        println!("  CHANGED  its kind was {}", printable(kind));
    }
    if old.changes.is_empty() {
        println!("  same     capabilities as the device paired now");
    }
    for (i, change) in old.changes.iter().enumerate() {
        let label = if i == 0 { "CHANGED" } else { "" };
        println!("  {label:<8} {}", printable(&change.summary));
    }
}

/// What proves the device asking is the one in front of the person: the
/// code it must show, and the warnings when the code cannot prove it.
fn show_proof(request: &ConsentRequest, credential: Option<CredentialChange>) {
    if let Some(change) = credential {
        println!("  WARNING  {}", change.words());
        println!(
            "           the code proves which device is asking now, not that it is the one paired before"
        );
    }
    if request.no_screen {
        println!(
            "  WARNING  this device says it has no screen: it cannot show a code, so NOTHING proves"
        );
        println!("           that the device asking is the one in front of you.");
    }
    if !request.no_screen {
        println!(
            "  code     {}   <- the device must show this same code",
            request.code
        );
    }
}

/// The capabilities a device declares, numbered from 1, each marked when
/// it is new or changed since the pairing it replaces.
fn show_capabilities(request: &ConsentRequest) {
    println!("  capabilities:");
    for (i, cap) in request.capabilities.iter().enumerate() {
        let asks = if cap.confirm { ", asks every time" } else { "" };
        let mark = request
            .replaces
            .as_ref()
            .and_then(|old| old.changes.iter().find(|c| c.capability == cap.name))
            .map_or("", |c| match c.change {
                ChangeKind::Added => " NEW",
                ChangeKind::Changed => " CHANGED",
                ChangeKind::Removed => "",
            });
        let title = cap
            .title
            .as_deref()
            .map(|t| format!(" \"{}\"", printable(t)))
            .unwrap_or_default();
        println!(
            "    [{}]{mark} {}{title} ({}{asks}): {}",
            i + 1,
            cap.name,
            cap.kind,
            printable(&cap.description)
        );
        if !cap.claims.is_empty() {
            println!("          the device claims: {}", cap.claims.join(", "));
        }
        print_params(&cap.params);
    }
}

/// The events a device declares, numbered on after its capabilities.
fn show_events(request: &ConsentRequest) {
    if request.events.is_empty() {
        return;
    }
    println!("  events (granted as capabilities are):");
    for (i, event) in request.events.iter().enumerate() {
        println!(
            "    [{}] {} (event): {}",
            request.capabilities.len() + i + 1,
            event.name,
            printable(&event.description)
        );
        print_params(&event.params);
    }
}

/// How to answer pairing request `id`: with the words a changed credential
/// or a missing screen asks for, else after checking the code.
fn ask_consent(id: u64, request: &ConsentRequest, credential: Option<CredentialChange>) {
    if let Some(change) = credential {
        let first = if request.no_screen {
            "pair without code: "
        } else {
            ""
        };
        let what = match change {
            CredentialChange::KeyChanged => "its key changed",
            CredentialChange::EncryptionDropped => "it drops encryption",
        };
        println!(
            "To pair it although {what}, type `{id} {first}{CONFIRM_CHANGE} ` then what to grant (e.g. `{id} {first}{CONFIRM_CHANGE} 1,3`); `{id} no` refuses"
        );
    } else if request.no_screen {
        println!(
            "To pair it anyway, type `{id} pair without code: ` then what to grant (e.g. `{id} pair without code: 1,3`); `{id} no` refuses"
        );
    } else {
        let keep = if request.replaces.is_some() {
            format!(", `{id} keep` grants again only what was granted and did not change")
        } else {
            String::new()
        };
        println!(
            "Does the device show {}? Answer `{id}` and what to grant (e.g. `{id} 1,3`, `{id} all`, `{id} none`{keep}; `{id} no` refuses pairing)",
            request.code
        );
    }
}

/// An agent's call that needs a yes: who asks, what it calls and why, its
/// input, and how to answer.
fn show_approval(prompt: &PendingPrompt, request: &ApprovalRequest) {
    println!("== #{} A call needs your yes ==", prompt.id);
    println!(
        "  asked by {}",
        crate::input::asker(request.agent_id.as_deref(), request.session_id.as_deref())
    );
    println!("  tool     {}", request.tool);
    println!(
        "  device   {}  capability {}",
        request.device_id, request.capability
    );
    println!("  channel  {}", channel_words(request.channel));
    if let Some(microphone) = &request.microphone {
        println!("  OPENS THE MICROPHONE {}", printable(&microphone.words()));
    }
    println!("  why      {}", printable(&request.reason));
    if request.input.is_empty() {
        println!("  input    (none)");
    }
    for (key, value) in &request.input {
        println!(
            "  input    {} = {}",
            printable(key),
            printable(&value.to_string())
        );
    }
    ask_approval(prompt, request);
}

/// How to answer an approval: once or no, and when its yes can be
/// remembered, for how long and how widely.
fn ask_approval(prompt: &PendingPrompt, request: &ApprovalRequest) {
    let id = prompt.id;
    let minutes = DEFAULT_ALLOWANCE_MINUTES;
    if prompt.can_remember {
        let agent = printable(request.agent_id.as_deref().unwrap_or_default());
        println!("Allow this call? Answer with its number and:");
        println!("  `{id} y`          allow it once");
        println!(
            "  `{id} args {minutes}`    allow agent {agent} this tool with exactly these arguments for {minutes} minutes"
        );
        println!(
            "  `{id} cap {minutes}`     allow agent {agent} any call of {} on {} for {minutes} minutes",
            request.capability, request.device_id
        );
        println!("                 (minutes from 1 to 1440)");
        println!("  `{id} n`          refuse");
    } else if request.microphone.is_some() && request.agent_id.is_some() {
        println!(
            "Allow this call? Answer `{id} y` to allow it once, `{id} n` to refuse (a yes to open a microphone is remembered only where an allow rule names the call)"
        );
    } else {
        println!(
            "Allow this call? Answer `{id} y` to allow it once, `{id} n` to refuse (a call of no agent cannot be remembered)"
        );
    }
}

/// Says which microphones opened or closed since `before` (the ids live
/// then); the ids live now.
fn show_microphones(vessel: &Vessel, before: &[String]) -> Vec<String> {
    let now = vessel.microphones().list();
    for mic in &now {
        if !before.contains(&mic.device_id) {
            println!(
                "● MICROPHONE LIVE on {} ({}, at most {} s): type `stop` to stop it",
                printable(&mic.device_id),
                printable(&mic.capability),
                mic.max_seconds
            );
        }
    }
    for id in before {
        if !now.iter().any(|m| &m.device_id == id) {
            println!("○ microphone off on {}", printable(id));
        }
    }
    now.into_iter().map(|m| m.device_id).collect()
}

/// The person's stop, typed: every microphone open now is stopped.
async fn stop_microphones(vessel: &Vessel) {
    let live = vessel.microphones().list();
    if live.is_empty() {
        println!("no microphone is live");
    }
    for mic in live {
        match vessel.stop_microphone(&mic.device_id).await {
            Ok(()) => println!("stopped {}", printable(&mic.device_id)),
            Err(e) => println!("{}", printable(&e.to_string())),
        }
    }
}

/// Applies a typed line to the waiting request it names (`ID ANSWER`, the
/// number as shown, `#` optional); returns the id answered. A line without
/// a number, or naming a request that no longer waits, answers nothing.
async fn answer_named(
    vessel: &Vessel,
    queue: &VecDeque<PendingPrompt>,
    line: &str,
) -> Result<u64, String> {
    let line = line.trim();
    let digits = line.trim_start_matches('#');
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    let (number, rest) = digits.split_at(end);
    // The number stands alone: `1,3` is a list of capabilities, not #1.
    let separated = rest.is_empty() || rest.starts_with(|c: char| c.is_whitespace() || c == ':');
    let Some(id) = number.parse::<u64>().ok().filter(|_| separated) else {
        return Err(match queue.front() {
            Some(current) => format!(
                "start the answer with the request's number, e.g. `{} {}`: an answer without it could reach another request",
                current.id,
                if matches!(current.prompt, Prompt::Approval(_)) {
                    "y"
                } else {
                    "all"
                }
            ),
            None => "nothing is waiting for an answer".to_owned(),
        });
    };
    let Some(prompt) = queue.iter().find(|p| p.id == id) else {
        return Err(format!(
            "#{id} is not waiting for an answer (answered elsewhere, withdrawn or timed out): nothing was done"
        ));
    };
    let rest = rest.trim_start_matches(':');
    answer(vessel, prompt, rest).await?;
    Ok(id)
}

/// The answer to an approval a typed line gives: `y`, `n`, `args [N]` or
/// `cap [N]` (N minutes, 15 when left out).
fn approval_answer(line: &str) -> Result<ApprovalAnswer, String> {
    let mut words = line.split_whitespace();
    let word = words.next().unwrap_or_default();
    let minutes = words.next();
    let scope = match (word, minutes) {
        ("y" | "yes", None) => return Ok(ApprovalAnswer::Once),
        ("n" | "no", None) => return Ok(ApprovalAnswer::Refuse),
        ("args" | "arguments", _) => AllowanceScope::Arguments,
        ("cap" | "capability", _) => AllowanceScope::Capability,
        _ => {
            return Err(format!(
                "`{}` is not an answer: say `y` (once), `args MINUTES` (these exact arguments), `cap MINUTES` (the whole capability) or `n`",
                printable(line)
            ));
        }
    };
    if words.next().is_some() {
        return Err(format!(
            "`{}` is not an answer: say `{word} MINUTES`, e.g. `{word} 15`",
            printable(line)
        ));
    }
    let minutes = match minutes {
        None => AllowanceMinutes::default(),
        Some(text) => {
            let n: u64 = text
                .parse()
                .map_err(|_| format!("`{}` is not a number of minutes", printable(text)))?;
            AllowanceMinutes::new(n).map_err(|e| e.to_string())?
        }
    };
    Ok(ApprovalAnswer::Remember(Remember { scope, minutes }))
}

/// Applies a typed answer to a prompt.
async fn answer(vessel: &Vessel, prompt: &PendingPrompt, line: &str) -> Result<(), String> {
    let line = line.trim().to_ascii_lowercase();
    match &prompt.prompt {
        Prompt::Approval(request) => answer_approval(vessel, prompt.id, request, &line).await,
        Prompt::Consent(request) => answer_consent(vessel, prompt.id, request, line).await,
    }
}

/// Applies a typed answer to approval `id`, and says what it did.
async fn answer_approval(
    vessel: &Vessel,
    id: u64,
    request: &ApprovalRequest,
    line: &str,
) -> Result<(), String> {
    let answer = approval_answer(line)?;
    let made = vessel
        .person()
        .answer_approval_confirmed(id, answer, Some(By::terminal()))
        .await
        .map_err(|e| e.to_string())?;
    match (answer, made) {
        (ApprovalAnswer::Refuse, _) => println!("refused"),
        (_, Some(allowance)) => println!("{}", remembered(request, &allowance)),
        (_, None) => println!("allowed once"),
    }
    Ok(())
}

/// What the terminal says of an allowance a yes to `request` made.
fn remembered(request: &ApprovalRequest, allowance: &Allowance) -> String {
    let what = match allowance.scope {
        AllowanceScope::Arguments => format!("{} with exactly these arguments", request.tool),
        AllowanceScope::Capability => format!(
            "any call of {} on {}",
            request.capability, request.device_id
        ),
    };
    let minutes = allowance
        .expires_at_ms
        .saturating_sub(allowance.created_at_ms)
        / 60_000;
    format!(
        "allowed, and remembered as allowance {} for {minutes} minutes: agent {}, {what}",
        allowance.id,
        printable(&allowance.agent_id)
    )
}

/// Applies a typed answer to pairing request `id`: a refusal, or the
/// grant once the words each warning asks for are there; says what it did.
async fn answer_consent(
    vessel: &Vessel,
    id: u64,
    request: &ConsentRequest,
    line: String,
) -> Result<(), String> {
    let typed = ConsentAnswer::read(line);
    typed.check_words(request)?;
    if typed.refuses() {
        vessel
            .person()
            .answer_consent(id, ConsentDecision::refuse().by(By::terminal()))
            .map_err(|e| e.to_string())?;
        println!("pairing refused");
        return Ok(());
    }
    let grant = granted(request, &typed.grant)?;
    let shown = if grant.is_empty() {
        "nothing".to_owned()
    } else {
        grant.join(", ")
    };
    vessel
        .person()
        .answer_consent_confirmed(id, typed.decision(grant))
        .await
        .map_err(|e| e.to_string())?;
    println!("paired, granted: {shown}");
    Ok(())
}

/// A typed answer to a pairing request: the grant (or `no`), after the
/// words that confirm a missing screen or a changed credential knowingly.
struct ConsentAnswer {
    /// What follows the words: `no`, `all`, `keep`, `none` or numbers.
    grant: String,
    /// `pair without code:` was typed.
    without_code: bool,
    /// [`CONFIRM_CHANGE`] was typed.
    change_confirmed: bool,
}

impl ConsentAnswer {
    /// Reads `line` (trimmed and lower case).
    fn read(line: String) -> Self {
        let (line, without_code) = match line.strip_prefix("pair without code:") {
            Some(rest) => (rest.trim().to_owned(), true),
            None => (line, false),
        };
        let (grant, change_confirmed) = match line.strip_prefix(CONFIRM_CHANGE) {
            Some(rest) => (rest.trim().to_owned(), true),
            None => (line, false),
        };
        ConsentAnswer {
            grant,
            without_code,
            change_confirmed,
        }
    }

    /// The answer is `no`.
    fn refuses(&self) -> bool {
        matches!(self.grant.as_str(), "no" | "n")
    }

    /// An error unless a yes to `request` has the words its warnings ask for.
    fn check_words(&self, request: &ConsentRequest) -> Result<(), String> {
        if request.no_screen && !self.without_code && !self.refuses() {
            return Err("this device cannot show a code: type `pair without code: ` and what to grant, or `no`".to_owned());
        }
        if let Some(change) = request.replaces.as_ref().and_then(|old| old.credential)
            && !self.change_confirmed
            && !self.refuses()
        {
            return Err(format!(
                "{}: type `{CONFIRM_CHANGE} ` and what to grant if you mean it, or `no`",
                change.words()
            ));
        }
        Ok(())
    }

    /// The person's yes, granting `grant`, with what they confirmed.
    fn decision(&self, grant: Vec<String>) -> ConsentDecision {
        let mut decision = ConsentDecision::approve(grant).by(By::terminal());
        if self.without_code {
            decision = decision.without_code_confirmed();
        }
        if self.change_confirmed {
            decision = decision.credential_change_confirmed();
        }
        decision
    }
}

/// The capabilities and events a typed grant names: `all`, `keep`, `none`
/// or their numbers as shown (`1,3`).
fn granted(request: &ConsentRequest, grant: &str) -> Result<Vec<String>, String> {
    match grant {
        "all" => Ok(request
            .capabilities
            .iter()
            .map(|c| c.name.clone())
            .chain(request.events.iter().map(|e| e.name.clone()))
            .collect()),
        "keep" => {
            let Some(old) = &request.replaces else {
                return Err("`keep` is for a device paired before: say what to grant".to_owned());
            };
            // Only what was granted and is the same now: a
            // capability that changed must be granted again by name.
            Ok(old
                .grants
                .iter()
                .filter(|g| !old.changes.iter().any(|c| &c.capability == *g))
                .cloned()
                .collect())
        }
        "" => Err("say what to grant after the number (`all`, `1,3`, `none`) or `no`".to_owned()),
        "none" => Ok(Vec::new()),
        list => list
            .split(',')
            .map(|part| numbered(request, part))
            .collect(),
    }
}

/// The capability or event shown as number `part` (from 1, events after
/// the capabilities).
fn numbered(request: &ConsentRequest, part: &str) -> Result<String, String> {
    let n: usize = part
        .trim()
        .parse()
        .map_err(|_| format!("`{}` is not a number", printable(part.trim())))?;
    n.checked_sub(1)
        .and_then(|i| {
            request.capabilities.get(i).map(|c| &c.name).or_else(|| {
                i.checked_sub(request.capabilities.len())
                    .and_then(|i| request.events.get(i))
                    .map(|e| &e.name)
            })
        })
        .cloned()
        .ok_or_else(|| format!("there is no capability {n}"))
}

/// Prints a capability's or an event's params under it, each with its
/// bounds in words when the device declares any.
fn print_params(params: &[dk_proto::admin::DeviceParam]) {
    for param in params {
        let required = if param.required { ", required" } else { "" };
        let bounds = param
            .bounds
            .as_deref()
            .map(|b| format!(", {}", printable(b)))
            .unwrap_or_default();
        println!("          {}: {}{required}{bounds}", param.name, param.ty);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use dk_core::registry::ConsentDecision;
    use dk_policy::PolicySet;
    use dk_vessel::{Limits, Vessel};
    use serde_json::Value;

    use super::*;

    use dk_testkit::lamp;

    /// Starts a pairing of `manifest` that waits for the person; returns
    /// its prompt and whether it paired.
    async fn asks_to_pair(
        vessel: &Arc<Vessel>,
        manifest: Value,
    ) -> (PendingPrompt, tokio::task::JoinHandle<bool>) {
        let id = manifest["id"].as_str().unwrap_or_default().to_owned();
        let asking = Arc::clone(vessel);
        let pairing = tokio::spawn(async move {
            let person = Arc::clone(asking.person());
            asking
                .registry()
                .pair(&manifest, |_| {}, |r| async move { Ok::<_, ()>(person.ask_consent(r, Duration::from_secs(60)).await) }, Duration::from_secs(60))
                .await
                .is_ok()
        });
        loop {
            if let Some(p) = vessel
                .person()
                .pending()
                .into_iter()
                .find(|p| matches!(&p.prompt, Prompt::Consent(r) if r.device_id == id))
            {
                return (p, pairing);
            }
            tokio::task::yield_now().await;
        }
    }

    /// Starts a pairing of the lamp that waits for the person.
    async fn consent_prompt(
        vessel: &Arc<Vessel>,
    ) -> (PendingPrompt, tokio::task::JoinHandle<bool>) {
        asks_to_pair(vessel, lamp()).await
    }

    #[test]
    fn typed_answers_to_an_approval() {
        let remember = |scope, minutes| {
            Ok(ApprovalAnswer::Remember(Remember {
                scope,
                minutes: AllowanceMinutes::new(minutes).unwrap(),
            }))
        };
        let not_an_answer = |typed: &str| {
            Err(format!(
                "`{typed}` is not an answer: say `y` (once), `args MINUTES` (these exact arguments), `cap MINUTES` (the whole capability) or `n`"
            ))
        };
        for (typed, expected) in [
            ("y", Ok(ApprovalAnswer::Once)),
            ("yes", Ok(ApprovalAnswer::Once)),
            ("n", Ok(ApprovalAnswer::Refuse)),
            ("no", Ok(ApprovalAnswer::Refuse)),
            ("args", remember(AllowanceScope::Arguments, 15)),
            ("args 30", remember(AllowanceScope::Arguments, 30)),
            ("arguments 1", remember(AllowanceScope::Arguments, 1)),
            ("cap 1440", remember(AllowanceScope::Capability, 1440)),
            ("capability", remember(AllowanceScope::Capability, 15)),
            (
                "cap 0",
                Err("an allowance lasts 1 to 1440 minutes, not 0".to_owned()),
            ),
            ("cap -1", Err("`-1` is not a number of minutes".to_owned())),
            (
                "args 5 7",
                Err("`args 5 7` is not an answer: say `args MINUTES`, e.g. `args 15`".to_owned()),
            ),
            ("", not_an_answer("")),
            ("maybe", not_an_answer("maybe")),
            ("y 5", not_an_answer("y 5")),
            ("all", not_an_answer("all")),
        ] {
            assert_eq!(approval_answer(typed), expected, "{typed:?}");
        }
    }

    #[tokio::test]
    async fn typed_answers_to_a_pairing_request() {
        for (line, paired, grants) in [
            ("1,3", true, vec!["read_light", "strobe"]),
            (" all ", true, vec!["read_light", "set_light", "strobe"]),
            ("none", true, vec![]),
            ("no", false, vec![]),
        ] {
            let vessel = Vessel::new(PolicySet::empty(), Limits::default());
            let (prompt, pairing) = consent_prompt(&vessel).await;
            answer(&vessel, &prompt, line).await.unwrap();
            assert_eq!(pairing.await.unwrap(), paired, "{line:?}");
            let granted = vessel
                .registry()
                .list()
                .first()
                .map(|d| d.grants.clone())
                .unwrap_or_default();
            assert_eq!(granted, grants, "{line:?}");
        }
    }

    #[tokio::test]
    async fn a_device_without_a_screen_needs_the_words() {
        let vessel = Vessel::new(PolicySet::empty(), Limits::default());
        let mut headless = lamp();
        headless["noScreen"] = Value::Bool(true);
        let (prompt, pairing) = asks_to_pair(&vessel, headless).await;
        assert!(
            answer(&vessel, &prompt, "all")
                .await
                .unwrap_err()
                .contains("cannot show a code")
        );
        answer(&vessel, &prompt, "pair without code: 1")
            .await
            .unwrap();
        assert!(pairing.await.unwrap());
        assert!(vessel.registry().is_granted("desk-lamp", "read_light"));
    }

    /// Starts a dk/2 pairing of the lamp with `key` that waits for the
    /// person; returns its prompt and whether it paired.
    async fn asks_with_key(
        vessel: &Arc<Vessel>,
        key: [u8; 32],
    ) -> (PendingPrompt, tokio::task::JoinHandle<bool>) {
        let manifest = dk_proto::validate_manifest(&lamp()).unwrap();
        let asking = Arc::clone(vessel);
        let pairing = tokio::spawn(async move {
            let person = Arc::clone(asking.person());
            asking
                .registry()
                .pair_with_key(manifest, "123456".to_owned(), key, |r| async move { Ok::<_, ()>(person.ask_consent(r, Duration::from_secs(60)).await) }, Duration::from_secs(60))
                .await
                .is_ok()
        });
        loop {
            if let Some(p) = vessel
                .person()
                .pending()
                .into_iter()
                .find(|p| matches!(&p.prompt, Prompt::Consent(_)))
            {
                return (p, pairing);
            }
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_changed_key_or_dropped_encryption_needs_the_words() {
        let vessel = Vessel::new(PolicySet::empty(), Limits::default());
        // Paired over dk/2 with one key.
        let (prompt, pairing) = asks_with_key(&vessel, [1; 32]).await;
        answer(&vessel, &prompt, "1").await.unwrap();
        assert!(pairing.await.unwrap());
        // Another key, then v1, for the same id: a plain yes is refused
        // with what changed, and the words pair it.
        for key in [Some([2; 32]), None] {
            let (prompt, pairing) = match key {
                Some(key) => asks_with_key(&vessel, key).await,
                None => consent_prompt(&vessel).await,
            };
            let Prompt::Consent(request) = &prompt.prompt else {
                panic!("{prompt:?}")
            };
            let expected = match key {
                Some(_) => CredentialChange::KeyChanged,
                None => CredentialChange::EncryptionDropped,
            };
            let said = request.replaces.as_ref().and_then(|old| old.credential);
            assert_eq!(said, Some(expected));
            let refused = answer(&vessel, &prompt, "all").await.unwrap_err();
            assert!(refused.contains(expected.words()), "{refused}");
            assert!(refused.contains("pair anyway:"), "{refused}");
            answer(&vessel, &prompt, "pair anyway: 1").await.unwrap();
            assert!(pairing.await.unwrap());
        }
    }

    /// Starts a pairing of a lamp with its own id; returns its prompt.
    async fn lamp_asks(
        vessel: &Arc<Vessel>,
        id: &str,
    ) -> (PendingPrompt, tokio::task::JoinHandle<bool>) {
        let mut manifest = lamp();
        manifest["id"] = Value::from(id);
        asks_to_pair(vessel, manifest).await
    }

    #[tokio::test]
    async fn an_answer_goes_to_the_request_it_names_or_nowhere() {
        let vessel = Vessel::new(PolicySet::empty(), Limits::default());
        let (a, pairing_a) = lamp_asks(&vessel, "lamp-a").await;
        let (b, pairing_b) = lamp_asks(&vessel, "lamp-b").await;
        // A leaves while the person types `all` meant for it.
        let mut queue: VecDeque<PendingPrompt> = [a.clone(), b.clone()].into();
        vessel
            .person()
            .answer_consent(a.id, ConsentDecision::refuse())
            .unwrap();
        assert!(!pairing_a.await.unwrap());
        queue.retain(|p| p.id != a.id);
        // The answer names A: it reaches nobody, and B is not paired.
        let error = answer_named(&vessel, &queue, &format!("{} all", a.id))
            .await
            .unwrap_err();
        assert!(error.contains("is not waiting"), "{error}");
        // Without a number nothing is answered either.
        for bare in ["all", "y", "1,3", "#", "pair without code: 1"] {
            let error = answer_named(&vessel, &queue, bare).await.unwrap_err();
            assert!(
                error.contains("start the answer with the request's number"),
                "{bare}: {error}"
            );
        }
        assert_eq!(vessel.person().pending().len(), 1);
        assert!(vessel.registry().list().is_empty());
        // Naming B answers B, in any of the spellings shown.
        assert_eq!(
            answer_named(&vessel, &queue, &format!("#{}: 1", b.id)).await,
            Ok(b.id)
        );
        assert!(pairing_b.await.unwrap());
        let paired = vessel.registry().list();
        assert_eq!(paired.len(), 1);
        assert_eq!(paired[0].grants, ["read_light"]);
    }

    #[tokio::test]
    async fn keep_grants_again_only_what_did_not_change() {
        let vessel = Vessel::new(PolicySet::empty(), Limits::default());
        let (first, pairing) = consent_prompt(&vessel).await;
        answer(&vessel, &first, "all").await.unwrap();
        assert!(pairing.await.unwrap());
        // The lamp pairs again; its strobe no longer asks every time.
        let mut changed = lamp();
        changed["capabilities"][2]["confirm"] = Value::Bool(false);
        let (prompt, pairing) = asks_to_pair(&vessel, changed).await;
        answer(&vessel, &prompt, "keep").await.unwrap();
        assert!(pairing.await.unwrap());
        let granted = vessel.registry().list()[0].grants.clone();
        assert_eq!(granted, ["read_light", "set_light"]);
    }

    #[tokio::test]
    async fn a_bad_answer_leaves_the_question_open() {
        let vessel = Vessel::new(PolicySet::empty(), Limits::default());
        let (prompt, pairing) = consent_prompt(&vessel).await;
        assert_eq!(
            answer(&vessel, &prompt, "4").await.unwrap_err(),
            "there is no capability 4"
        );
        assert_eq!(
            answer(&vessel, &prompt, "one").await.unwrap_err(),
            "`one` is not a number"
        );
        assert_eq!(
            answer(&vessel, &prompt, "0").await.unwrap_err(),
            "there is no capability 0"
        );
        assert!(
            answer(&vessel, &prompt, "")
                .await
                .unwrap_err()
                .starts_with("say what to grant")
        );
        assert!(
            answer(&vessel, &prompt, "keep")
                .await
                .unwrap_err()
                .starts_with("`keep` is for a device paired before")
        );
        assert_eq!(vessel.person().pending().len(), 1);
        vessel
            .person()
            .answer_consent(prompt.id, ConsentDecision::refuse())
            .unwrap();
        assert!(!pairing.await.unwrap());
    }
}
