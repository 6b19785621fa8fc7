//! `dk pairings`, `dk approvals`, `dk devices`: the person's commands, on top
//! of a running vessel's admin API, reached only on the admin socket in its
//! data directory (found through dk's home, `home.rs`): the token goes to
//! no listener but a socket this user's vessel made.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use dk_http::{AdminAnswer, AdminClient, AdminToken, connect_private_socket};
use dk_proto::admin as api;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::home::Paths;
use crate::input::{asker, channel_words, print_json, printable};

/// Where the vessel is.
#[derive(Args)]
pub struct Target {
    /// The vessel's data directory (holds its admin socket). [default:
    /// `vessel` in dk's home: $DK_HOME, else $XDG_DATA_HOME/dk, else
    /// ~/.local/share/dk]
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
    /// The admin token's file. [default: `admin-token` in dk's home]
    #[arg(long, global = true)]
    pub admin_token_file: Option<PathBuf>,
    /// Print the API's JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
}

/// `dk pairings`.
#[derive(Subcommand)]
pub enum PairingsCommand {
    /// List pending pairing requests (the default).
    List,
    /// Approve a pairing request, granting the named capabilities.
    Approve {
        /// The request id.
        id: u64,
        /// Capabilities to grant, comma separated.
        #[arg(long, value_delimiter = ',')]
        grant: Vec<String>,
        /// Pair a device that cannot show a code, knowing nothing proves it
        /// is the device in front of you.
        #[arg(long)]
        without_code: bool,
        /// Pair a device whose key changed, or that asks over v1 where it
        /// was paired over dk/2, knowing it may be another device.
        #[arg(long)]
        confirm_change: bool,
    },
    /// Refuse a pairing request.
    Refuse {
        /// The request id.
        id: u64,
    },
}

/// `dk approvals`.
#[derive(Subcommand)]
pub enum ApprovalsCommand {
    /// List calls waiting for a yes (the default).
    List,
    /// Allow a call: once, or remembered for its agent for a while.
    Allow {
        /// The approval id.
        id: u64,
        /// Also allow the same agent, without asking, for `--minutes`:
        /// `args` this tool with exactly these arguments, `cap` any call of
        /// this capability.
        #[arg(long, value_enum)]
        remember: Option<RememberWhat>,
        /// How long to remember it, 1 to 1440 minutes. [default: 15]
        #[arg(long, requires = "remember")]
        minutes: Option<u64>,
    },
    /// Refuse a call.
    Deny {
        /// The approval id.
        id: u64,
    },
    /// Remembered allowances: list (the default), revoke.
    Remembered {
        #[command(subcommand)]
        command: Option<RememberedCommand>,
    },
}

/// What a remembered yes covers.
#[derive(Clone, Copy, ValueEnum)]
pub enum RememberWhat {
    /// This tool with exactly these arguments.
    #[value(alias = "arguments")]
    Args,
    /// Any call of this capability.
    #[value(alias = "capability")]
    Cap,
}

/// `dk approvals remembered`.
#[derive(Subcommand)]
pub enum RememberedCommand {
    /// List live allowances (the default).
    List,
    /// Revoke an allowance: the agent is asked again.
    Revoke {
        /// The allowance id.
        id: u64,
    },
}

/// `dk devices`.
#[derive(Subcommand)]
pub enum DevicesCommand {
    /// List paired devices and their grants (the default).
    List,
    /// Grant a capability.
    Grant {
        /// The device id.
        device: String,
        /// The capability.
        capability: String,
    },
    /// Revoke a capability.
    Revoke {
        /// The device id.
        device: String,
        /// The capability.
        capability: String,
    },
    /// Unpair a device.
    Unpair {
        /// The device id.
        device: String,
    },
    /// Stop a voice device at once: its microphone closed, its speaker
    /// silenced.
    Stop {
        /// The device id.
        device: String,
    },
}

/// A client for the vessel of `target`, once its admin socket answers.
async fn client(target: &Target) -> Result<AdminClient, String> {
    let paths = Paths::resolve(
        target.data_dir.as_deref(),
        target.admin_token_file.as_deref(),
    )
    .map_err(|e| e.to_string())?;
    let socket = paths.admin_socket();
    // The socket is checked to be this user's before anything is sent, so
    // the token never reaches another user's listener.
    match connect_private_socket(&socket).await {
        Ok(_) => {}
        Err(e) if e.is_absent() => return Err(paths.no_vessel()),
        Err(e) => return Err(format!("cannot reach the vessel: {e}")),
    }
    let token = AdminToken::read_from(&paths.admin_token_file)
        .map_err(|e| format!("the admin token file is refused: {e}"))?;
    Ok(AdminClient::over_socket(socket, token))
}

/// Runs one request, or several, on a small runtime.
pub(crate) fn with_client<F, Fut>(target: &Target, f: F) -> ExitCode
where
    F: FnOnce(AdminClient) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
        .and_then(|runtime| runtime.block_on(async { f(client(target).await?).await }));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", printable(&e));
            ExitCode::FAILURE
        }
    }
}

pub(crate) fn ok(answer: AdminAnswer) -> Result<Value, String> {
    if answer.is_success() {
        Ok(answer.body)
    } else {
        Err(refusal(&answer))
    }
}

/// A successful answer's body, read as the route's `dk_proto::admin` type.
pub(crate) fn ok_as<T: DeserializeOwned>(answer: AdminAnswer) -> Result<T, String> {
    if answer.is_success() {
        answer.read().map_err(|e| e.to_string())
    } else {
        Err(refusal(&answer))
    }
}

/// Why the vessel refused a request, in its words when it gave them.
fn refusal(answer: &AdminAnswer) -> String {
    answer
        .error()
        .unwrap_or_else(|| format!("the vessel answered {}", answer.status))
}

fn pending_of(list: &Value, kind: &str) -> Vec<Value> {
    list.as_array()
        .map(|a| {
            a.iter()
                .filter(|p| at(p, "kind") == kind)
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// Runs `dk status`.
pub fn status(target: &Target) -> ExitCode {
    let json = target.json;
    with_client(target, |c| async move {
        let answer = c.get("/v1/status").await.map_err(|e| e.to_string())?;
        if json {
            println!("{}", ok(answer)?);
            return Ok(());
        }
        let status: api::Status = ok_as(answer)?;
        println!(
            "vessel fingerprint   {}",
            status
                .fingerprint
                .as_deref()
                .unwrap_or("(none: this vessel speaks only v1)")
        );
        println!(
            "devices              {} paired, {} connected ({} connections open)",
            status.paired, status.connected, status.connections
        );
        println!("waiting for you      {} prompts", status.pending);
        if status.microphones.is_empty() {
            println!("microphones          none live");
        }
        for mic in &status.microphones {
            println!(
                "microphone LIVE      {} ({}, at most {} s): dk devices stop {} ends it",
                printable(&mic.device_id),
                printable(&mic.capability),
                mic.max_seconds,
                printable(&mic.device_id)
            );
        }
        let rules = ok(c.get("/v1/rules").await.map_err(|e| e.to_string())?)?;
        let count = rules.get("rules").and_then(Value::as_u64).unwrap_or(0);
        match (
            rules.get("file").and_then(Value::as_str),
            rules.get("sha256").and_then(Value::as_str),
        ) {
            (Some(file), Some(sha256)) => println!(
                "device_use rules     {count} from {} (sha256 {sha256})",
                printable(file)
            ),
            _ => println!("device_use rules     {count} (from no file)"),
        }
        println!(
            "dk/2                 {} handshakes, {} failed channels, {} plain v1 upgrades refused",
            status.secure_handshakes, status.channel_failures, status.plain_v1_refused
        );
        if let Some(fleet) = &status.fleet {
            print_fleet(fleet);
        }
        Ok(())
    })
}

/// A fleet member's state, as `dk status` prints it.
fn print_fleet(fleet: &api::FleetStatus) {
    println!(
        "fleet member         {} (run {}), NATS {}, {} devices connected here",
        printable(&fleet.member),
        fleet.incarnation,
        if fleet.connected { "up" } else { "DOWN" },
        fleet.devices
    );
    if fleet.members.is_empty() {
        println!("  no other member heard");
    }
    for member in &fleet.members {
        println!(
            "  member {:<16} run {}, {} devices, heard {} ms ago",
            printable(&member.member),
            member.incarnation,
            member.devices,
            member.heard_ago_ms
        );
    }
    for gone in &fleet.departed {
        println!(
            "  left   {:<16} run {}, {} s ago ({})",
            printable(&gone.member),
            gone.incarnation,
            gone.ago_ms / 1000,
            if gone.goodbye {
                "said goodbye"
            } else {
                "went silent"
            }
        );
    }
    let d = &fleet.dropped;
    println!(
        "  messages dropped   {} forged, {} replayed, {} stale, {} too large, {} of another version (largest carried: {} bytes)",
        d.forged, d.replayed, d.stale, d.too_large, d.other_version, fleet.max_message
    );
}

/// Runs `dk console`: asks the vessel for a fresh login link and prints
/// it (only the link, so `xdg-open "$(dk console)"` works).
pub fn console(target: &Target) -> ExitCode {
    let json = target.json;
    with_client(target, |c| async move {
        let answer = c
            .post("/v1/console/link", &serde_json::json!({}))
            .await
            .map_err(|e| e.to_string())?;
        let body: Value = ok_as(answer)?;
        if json {
            println!("{body}");
            return Ok(());
        }
        let link: dk_proto::admin::LoginLink =
            serde_json::from_value(body).map_err(|_| "the vessel gave no link")?;
        println!("{}", link.url);
        eprintln!("(works once, for 15 minutes; keep it to yourself: it signs in as you)");
        Ok(())
    })
}

/// Runs `dk pairings`.
pub fn pairings(target: &Target, command: Option<PairingsCommand>) -> ExitCode {
    let json = target.json;
    with_client(target, |c| async move {
        match command.unwrap_or(PairingsCommand::List) {
            PairingsCommand::List => list_pairings(&c, json).await,
            PairingsCommand::Approve {
                id,
                grant,
                without_code,
                confirm_change,
            } => {
                let confirmed = Confirmed {
                    without_code,
                    change: confirm_change,
                };
                approve_pairing(&c, id, grant, confirmed).await
            }
            PairingsCommand::Refuse { id } => {
                ok(c.post(
                    &format!("/v1/pending/{id}/consent"),
                    &api::ConsentAnswer::default(),
                )
                .await
                .map_err(|e| e.to_string())?)?;
                println!("pairing {id} refused");
                Ok(())
            }
        }
    })
}

/// `dk pairings list`: the pairing requests waiting, as JSON or text.
async fn list_pairings(c: &AdminClient, json: bool) -> Result<(), String> {
    let list = pending_of(
        &ok(c.get("/v1/pending").await.map_err(|e| e.to_string())?)?,
        "consent",
    );
    print_list(
        json,
        &Value::Array(list),
        "no pairing requests",
        None,
        |p: &api::Pending| {
            if let api::Prompt::Consent(r) = &p.prompt {
                print_pairing(p.id, r);
            }
        },
    )
}

/// Pairing request `id` as text: the device and its code, what warns
/// against a plain yes, the pairing it replaces, and its capabilities.
fn print_pairing(id: u64, r: &api::ConsentRequest) {
    println!(
        "#{id}  {} ({}) code {}{}",
        printable(&r.name),
        printable(&r.device_id),
        printable(&r.code),
        match (r.replaces.is_none(), r.no_screen) {
            (_, true) =>
                "  [NO SCREEN: nothing proves which device this is; approve with --without-code]",
            (false, false) => "  [replaces an existing pairing and its grants]",
            (true, false) => "",
        }
    );
    println!("      channel  {}", channel_words(r.channel));
    if let Some(change) = r.replaces.as_ref().and_then(|old| old.credential) {
        println!("      WARNING  {}", change.words());
        println!(
            "               the code proves which device is asking now, not that it is the one paired before; approve with --confirm-change only if you mean it"
        );
    }
    if let Some(old) = &r.replaces {
        println!(
            "      replaces: {}, granted {}",
            crate::input::ago(old.paired_at_ms),
            joined(&old.grants)
        );
        for change in &old.changes {
            println!("      changed:  {}", printable(&change.summary));
        }
    }
    for cap in &r.capabilities {
        let asks = if cap.confirm { ", asks every time" } else { "" };
        println!(
            "      {} ({}{asks}): {}",
            printable(&cap.name),
            cap.kind,
            printable(&cap.description)
        );
    }
}

/// What `dk pairings approve` was told the person confirms knowingly.
#[derive(Clone, Copy)]
struct Confirmed {
    /// `--without-code`: pairing a device that cannot show a code.
    without_code: bool,
    /// `--confirm-change`: pairing a device whose key changed or that
    /// drops encryption.
    change: bool,
}

impl Confirmed {
    /// What a yes to `request` lacks, if anything: each confirmation the
    /// vessel would need and was not given.
    fn missing(self, request: &api::ConsentRequest) -> Option<String> {
        let change = request.replaces.as_ref().and_then(|old| old.credential);
        if let (Some(change), false) = (change, self.change) {
            return Some(format!(
                "{}: pass --confirm-change to pair it knowingly, or refuse it",
                change.words()
            ));
        }
        if request.no_screen && !self.without_code {
            return Some(
                "this device cannot show a code, so nothing proves it is the one in front of you: pass --without-code to pair it knowingly, or refuse it"
                    .to_owned(),
            );
        }
        None
    }
}

/// `dk pairings approve`: grants `grant` to pairing request `id`.
///
/// A yes the vessel would take as no pairing at all (a confirmation it
/// needs is missing) is refused here, saying which, instead of being sent
/// to fail quietly.
async fn approve_pairing(
    c: &AdminClient,
    id: u64,
    grant: Vec<String>,
    confirmed: Confirmed,
) -> Result<(), String> {
    if !confirmed.change || !confirmed.without_code {
        let listed: Vec<api::Pending> =
            ok_as(c.get("/v1/pending").await.map_err(|e| e.to_string())?)?;
        let request = listed
            .iter()
            .find(|p| p.id == id)
            .and_then(|p| match &p.prompt {
                api::Prompt::Consent(r) => Some(r),
                api::Prompt::Approval(_) => None,
            });
        if let Some(why) = request.and_then(|request| confirmed.missing(request)) {
            return Err(why);
        }
    }
    ok(c.post(
        &format!("/v1/pending/{id}/consent"),
        &api::ConsentAnswer {
            approved: true,
            grant,
            confirm_without_code: confirmed.without_code,
            confirm_credential_change: confirmed.change,
        },
    )
    .await
    .map_err(|e| e.to_string())?)?;
    println!("pairing {id} approved");
    Ok(())
}

/// Runs `dk approvals`.
pub fn approvals(target: &Target, command: Option<ApprovalsCommand>) -> ExitCode {
    let json = target.json;
    with_client(target, |c| async move {
        let e = |e: dk_http::AdminClientError| e.to_string();
        let (id, body) = match command.unwrap_or(ApprovalsCommand::List) {
            ApprovalsCommand::List => {
                let list = pending_of(&ok(c.get("/v1/pending").await.map_err(e)?)?, "approval");
                print_list(
                    json,
                    &Value::Array(list),
                    "no calls waiting",
                    None,
                    |p: &api::Pending| {
                        let api::Prompt::Approval(r) = &p.prompt else {
                            return;
                        };
                        println!(
                            "#{}  {}  ({})",
                            p.id,
                            printable(&r.tool),
                            printable(&r.reason)
                        );
                        println!(
                            "      asked by {}",
                            asker(r.agent_id.as_deref(), r.session_id.as_deref())
                        );
                        println!("      channel  {}", channel_words(r.channel));
                        if let Some(microphone) = &r.microphone {
                            println!(
                                "      opens the microphone {}",
                                printable(&microphone.words())
                            );
                        }
                        for (key, value) in &r.input {
                            println!(
                                "      {} = {}",
                                printable(key),
                                printable(&value.to_string())
                            );
                        }
                        if p.can_remember {
                            println!(
                                "      may be remembered: dk approvals allow {} --remember args|cap [--minutes N]",
                                p.id
                            );
                        }
                    },
                )?;
                return Ok(());
            }
            ApprovalsCommand::Remembered { command } => {
                return remembered(&c, json, command.unwrap_or(RememberedCommand::List)).await;
            }
            ApprovalsCommand::Allow {
                id,
                remember,
                minutes,
            } => {
                let remember =
                    remember.map(|what| {
                        let scope = match what {
                            RememberWhat::Args => api::AllowanceScope::Arguments,
                            RememberWhat::Cap => api::AllowanceScope::Capability,
                        };
                        api::Remember {
                            scope: scope.into(),
                            minutes: Some(minutes.unwrap_or(u64::from(
                                dk_core::allowances::DEFAULT_ALLOWANCE_MINUTES,
                            ))),
                        }
                    });
                (
                    id,
                    api::ApprovalAnswer {
                        approved: true,
                        remember,
                    },
                )
            }
            ApprovalsCommand::Deny { id } => (id, api::ApprovalAnswer::default()),
        };
        let answered = ok(c
            .post(&format!("/v1/pending/{id}/approval"), &body)
            .await
            .map_err(e)?)?;
        // A remembered yes answers with its allowance (201), anything else with nothing.
        let allowance = match &answered {
            Value::Null => None,
            body => Some(api::Allowance::deserialize(body).map_err(|e| e.to_string())?),
        };
        if json && !answered.is_null() {
            print_json(&answered);
        } else if let Some(allowance) = allowance {
            println!(
                "call {id} allowed, and remembered as allowance {}: {}",
                allowance.id,
                covers(&allowance)
            );
        } else if body.approved {
            println!("call {id} allowed once");
        } else {
            println!("call {id} refused");
        }
        Ok(())
    })
}

/// What an allowance lets its agent do, and for how long, in words.
fn covers(allowance: &api::Allowance) -> String {
    let what = match allowance.scope {
        api::AllowanceScope::Arguments => format!(
            "{} with exactly {}",
            printable(&allowance.tool),
            allowance
                .arguments
                .as_deref()
                .map_or_else(|| "null".to_owned(), printable)
        ),
        api::AllowanceScope::Capability => format!(
            "any call of {} on {}",
            printable(&allowance.capability),
            printable(&allowance.device_id)
        ),
    };
    format!(
        "agent {} may call {what} until {}",
        printable(&allowance.agent_id),
        until(allowance.expires_at_ms)
    )
}

/// How long until `at_ms`, from now: `in 14 min 5 s`.
fn until(at_ms: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let left = at_ms.saturating_sub(now) / 1000;
    format!("in {} min {} s", left / 60, left % 60)
}

/// Runs `dk approvals remembered`.
async fn remembered(c: &AdminClient, json: bool, command: RememberedCommand) -> Result<(), String> {
    let e = |e: dk_http::AdminClientError| e.to_string();
    match command {
        RememberedCommand::List => {
            let list = ok(c.get("/v1/approvals/remembered").await.map_err(e)?)?;
            print_list(
                json,
                &list,
                "no remembered allowances",
                Some(format!(
                    "{:<5} {:<20} {:<36} {:<10} {:<16} {:>5}",
                    "ID", "AGENT", "TOOL", "COVERS", "ENDS", "USES"
                )),
                |a: &api::Allowance| {
                    println!(
                        "{:<5} {:<20} {:<36} {:<10} {:<16} {:>5}",
                        a.id,
                        printable(&a.agent_id),
                        printable(&a.tool),
                        a.scope.as_str(),
                        until(a.expires_at_ms),
                        a.uses,
                    );
                    if let Some(arguments) = &a.arguments {
                        println!("      exactly {}", printable(arguments));
                    }
                },
            )?;
        }
        RememberedCommand::Revoke { id } => {
            ok(c.delete(&format!("/v1/approvals/remembered/{id}"))
                .await
                .map_err(e)?)?;
            println!("allowance {id} revoked: its agent is asked again");
        }
    }
    Ok(())
}

/// Runs `dk devices`.
pub fn devices(target: &Target, command: Option<DevicesCommand>) -> ExitCode {
    let json = target.json;
    with_client(target, |c| async move {
        let e = |e: dk_http::AdminClientError| e.to_string();
        match command.unwrap_or(DevicesCommand::List) {
            DevicesCommand::List => {
                let list = ok(c.get("/v1/devices").await.map_err(e)?)?;
                print_list(json, &list, "no paired devices", None, |d: &api::Device| {
                    let state = match (&d.held_by, d.connected) {
                        (_, true) => "connected".to_owned(),
                        (Some(member), false) => format!("held by {}", printable(member)),
                        (None, false) => "offline".to_owned(),
                    };
                    println!(
                        "{} ({}) {state}, {}; granted: {}",
                        printable(&d.id),
                        printable(&d.name),
                        channel_words(d.channel),
                        joined(&d.grants)
                    );
                    for capability in &d.capabilities {
                        println!("  {}", capability_line(capability));
                    }
                })?;
            }
            DevicesCommand::Grant { device, capability } => {
                ok(c.put(&format!(
                    "/v1/devices/{}/grants/{}",
                    segment(&device),
                    segment(&capability)
                ))
                .await
                .map_err(e)?)?;
                println!("granted {capability} on {device}");
            }
            DevicesCommand::Revoke { device, capability } => {
                ok(c.delete(&format!(
                    "/v1/devices/{}/grants/{}",
                    segment(&device),
                    segment(&capability)
                ))
                .await
                .map_err(e)?)?;
                println!("revoked {capability} on {device}");
            }
            DevicesCommand::Unpair { device } => {
                ok(c.delete(&format!("/v1/devices/{}", segment(&device)))
                    .await
                    .map_err(e)?)?;
                println!("unpaired {device}");
            }
            DevicesCommand::Stop { device } => {
                ok(c.post(
                    &format!("/v1/devices/{}/stop", segment(&device)),
                    &Value::Null,
                )
                .await
                .map_err(e)?)?;
                println!("stopped {}", printable(&device));
            }
        }
        Ok(())
    })
}

/// A capability as `dk devices` shows it: its name, kind, whether it asks
/// every time, and its params (what a rule's `input.<param>` may name):
/// `set_target (actuator): celsius (number, required: 5-30), mode (string)`.
fn capability_line(capability: &api::DeviceCapability) -> String {
    let asks = if capability.confirm {
        ", asks every time"
    } else {
        ""
    };
    let params: Vec<String> = capability
        .params
        .iter()
        .map(|p| {
            let required = if p.required { ", required" } else { "" };
            let about = p
                .description
                .as_deref()
                .map_or_else(String::new, |d| format!(": {}", printable(d)));
            format!("{} ({}{required}{about})", printable(&p.name), p.ty)
        })
        .collect();
    let params = if params.is_empty() {
        "no params".to_owned()
    } else {
        params.join(", ")
    };
    format!(
        "{} ({}{asks}): {params}",
        printable(&capability.name),
        capability.kind
    )
}

/// Prints a listing of the admin API, the one way every `list` command
/// prints: with `--json` the list as the vessel gave it, on one line
/// ([`print_json`]); else each item read as the admin API's type `T`, and
/// `empty` when there is none, or the `header` line (if any) and each item
/// as `show` prints it.
pub(crate) fn print_list<T: DeserializeOwned>(
    json: bool,
    list: &Value,
    empty: &str,
    header: Option<String>,
    show: impl FnMut(&T),
) -> Result<(), String> {
    if json {
        print_json(list);
        return Ok(());
    }
    let items = Vec::<T>::deserialize(list).map_err(|e| e.to_string())?;
    if items.is_empty() {
        println!("{empty}");
        return Ok(());
    }
    if let Some(header) = header {
        println!("{header}");
    }
    items.iter().for_each(show);
    Ok(())
}

/// Texts joined with `, ` (each made printable), or `nothing`.
pub(crate) fn joined<S: AsRef<str>>(items: &[S]) -> String {
    if items.is_empty() {
        return "nothing".to_owned();
    }
    let shown: Vec<String> = items.iter().map(|item| printable(item.as_ref())).collect();
    shown.join(", ")
}

/// `value[key]`, or `null` when absent.
pub(crate) fn at<'v>(value: &'v Value, key: &str) -> &'v Value {
    static NULL: Value = Value::Null;
    value.get(key).unwrap_or(&NULL)
}

/// `text` percent-encoded for one URL path segment.
pub(crate) fn segment(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {

    use super::asker;

    #[test]
    fn an_approval_says_who_asks() {
        let request = dk_core::adapter::ApprovalRequest {
            tool: "device__front_door__unlock".to_owned(),
            device_id: "front-door".to_owned(),
            capability: "unlock".to_owned(),
            input: serde_json::Map::new(),
            reason: "asks every time".to_owned(),
            agent_id: Some("kitchen-helper".to_owned()),
            session_id: Some("s-1\u{1b}[2J".to_owned()),
            channel: dk_proto::Channel::V1,
            microphone: None,
        };
        assert_eq!(
            asker(request.agent_id.as_deref(), request.session_id.as_deref()),
            "agent kitchen-helper, session s-1\\u{1b}[2J"
        );
        let host = dk_core::adapter::ApprovalRequest {
            agent_id: None,
            session_id: None,
            ..request
        };
        assert_eq!(
            asker(host.agent_id.as_deref(), host.session_id.as_deref()),
            "no agent (the vessel's own host or the admin API), no session"
        );
    }
}
