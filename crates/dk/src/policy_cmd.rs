//! `dk policy check`, `lint`, `explain` and `test`: read a rule file
//! fail-closed, warn about rules that can never decide, say which rule
//! decides a given call and why, and run a table of cases; `dk policy
//! reload`: a running vessel reads its rule file again.

mod cases;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::SystemTime;

use clap::Subcommand;
use dk_policy::{
    CONFORMANCE_CASES, Call, DEVICE_USE, DEVICE_USE_FIELDS, DeclaredParams, DeviceClass,
    DeviceConfig, DeviceUseContext, InputType, LintKind, LintOptions, LintWarning, PolicyError,
    PolicySet, RawDevicePolicy, ResolveOptions, lint_yaml_str_with, run_device_policy_conformance,
};
use serde_json::{Map, Value, json};

use crate::home::data_dir_or_home;
use crate::input::{print_json, printable, read_text};

/// Rule file commands.
#[derive(Subcommand)]
pub enum PolicyCommand {
    /// Check a rule file; exit 0 when it is good, 1 listing every error.
    Check {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// The rule file.
        file: PathBuf,
    },
    /// Warn about rules of a good rule file that can never decide; exit 0
    /// (1 with `--deny-warnings` and a warning), or 1 when the file is refused.
    Lint {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Exit 1 when there is any warning.
        #[arg(long)]
        deny_warnings: bool,
        /// Warn about a `deviceId` or `capability` no manifest in this
        /// directory (`*.json`) has, and `input.` params none declares; may
        /// be given more than once.
        #[arg(long = "manifests", value_name = "DIR")]
        manifests: Vec<PathBuf>,
        /// Warn about a `deviceId` or `capability` no device paired with the
        /// vessel has, and `input.` params none declares (its data
        /// directory: `--data-dir`, else dk's home).
        #[arg(long)]
        paired: bool,
        /// The vessel's data directory, for `--paired`.
        #[arg(long, requires = "paired")]
        data_dir: Option<PathBuf>,
        /// The rule file.
        file: PathBuf,
    },
    /// Evaluate a rule file against one call's context.
    Explain {
        /// The rule file.
        file: PathBuf,
        /// The context as a JSON object of strings, e.g.
        /// `{"deviceId":"desk-lamp","capability":"set_light","capabilityKind":"actuator","agentId":"main"}`.
        #[arg(long)]
        context: String,
        /// The call's input, a JSON object, for `input.<param>` conditions
        /// (device_use only).
        #[arg(long)]
        input: Option<String>,
        /// When the call is made, for `time` and `weekday` conditions
        /// (device_use only): `2026-12-01T23:30:00` in the rules' zone, or
        /// with an offset (`2026-12-01T22:30:00Z`). Default: now.
        #[arg(long)]
        at: Option<String>,
        /// The action asked for.
        #[arg(long, default_value = DEVICE_USE)]
        action: String,
        /// Print `{"decision","rule","reason"}` instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Run a table of cases (YAML: context, expected decision and rule)
    /// against a rule file; exit 1 on any mismatch or a bad file.
    Test {
        /// The rule file.
        file: PathBuf,
        /// The cases file.
        cases: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Make a running vessel read its rule file (`dk vessel --policies`)
    /// again: its rules are then in force, or, when the file is refused,
    /// every error is listed and the rules in force stay (exit 1). Recorded
    /// in the audit log either way, with the file's SHA-256.
    Reload {
        #[command(flatten)]
        target: crate::admin_cmd::Target,
    },
    /// Run the six admission conformance cases on a streaming device-class
    /// configuration (`{"kind": "voice"|"desktop-control", "policy": {...}}`).
    Conformance {
        /// The device-class configuration (JSON).
        file: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Runs a rule file command.
pub fn run(command: PolicyCommand) -> ExitCode {
    match command {
        PolicyCommand::Check { json, file } => check(&file, json),
        PolicyCommand::Lint {
            json,
            deny_warnings,
            manifests,
            paired,
            data_dir,
            file,
        } => {
            let paired = paired.then_some(data_dir);
            match declared_params(&manifests, paired.as_ref().map(Option::as_deref)) {
                Ok(declared) => lint(&file, json, deny_warnings, declared.as_ref()),
                Err(e) => {
                    eprintln!("error: {}", printable(&e));
                    ExitCode::FAILURE
                }
            }
        }
        PolicyCommand::Explain {
            file,
            context,
            input,
            at,
            action,
            json,
        } => explain(
            &file,
            &Asked {
                context: &context,
                input: input.as_deref(),
                at: at.as_deref(),
                action: &action,
            },
            json,
        ),
        PolicyCommand::Test { file, cases, json } => cases::test(&file, &cases, json),
        PolicyCommand::Conformance { file, json } => conformance(&file, json),
        PolicyCommand::Reload { target } => reload(&target),
    }
}

/// Asks the vessel to read its rule file again, and says what it did.
fn reload(target: &crate::admin_cmd::Target) -> ExitCode {
    let json = target.json;
    crate::admin_cmd::with_client(target, |c| async move {
        let answer = c
            .post("/v1/rules/reload", &json!({}))
            .await
            .map_err(|e| e.to_string())?;
        let body = &answer.body;
        let shown = |text: &Option<String>| printable(text.as_deref().unwrap_or(""));
        match answer.status {
            200 if json => print_json(body),
            200 => {
                let done: dk_proto::admin::RulesReloaded = serde_json::from_value(body.clone())
                    .map_err(|e| format!("the vessel's answer is not a reload: {e}"))?;
                println!(
                    "reloaded `{}`: {} rules in force (sha256 {})",
                    shown(&done.file),
                    done.rules,
                    shown(&done.sha256)
                );
            }
            422 => {
                if json {
                    print_json(body);
                }
                let refused: dk_proto::admin::RulesRefused =
                    serde_json::from_value(body.clone())
                        .map_err(|e| format!("the vessel's answer is not a refused reload: {e}"))?;
                eprintln!(
                    "the rule file `{}` is refused:",
                    shown(&refused.in_force.file)
                );
                for error in &refused.errors {
                    eprintln!("  {}", printable(error));
                }
                return Err(format!(
                    "the rules in force stay: `{}` as it was (sha256 {})",
                    shown(&refused.in_force.file),
                    shown(&refused.in_force.sha256)
                ));
            }
            _ => return crate::admin_cmd::ok(answer).map(|_| ()),
        }
        Ok(())
    })
}

/// Reads a device-class configuration and runs the conformance cases.
fn conformance(file: &Path, json: bool) -> ExitCode {
    let outcome = read_text(file)
        .and_then(|text| serde_json::from_str::<Value>(&text).map_err(|e| format!("not JSON: {e}")))
        .and_then(|doc| {
            let kind = doc
                .get("kind")
                .and_then(Value::as_str)
                .ok_or_else(|| "the configuration needs a `kind`".to_owned())
                .and_then(|k| DeviceClass::parse(k).map_err(|e| e.to_string()))?;
            let policy = RawDevicePolicy::from_json(doc.get("policy").unwrap_or(&Value::Null))
                .map_err(|e| e.to_string())?;
            Ok(DeviceConfig { kind, policy })
        });
    let config = match outcome {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {}", printable(&e));
            return ExitCode::FAILURE;
        }
    };
    match run_device_policy_conformance(&config, &ResolveOptions::default()) {
        Ok(passed) => {
            if json {
                print_json(&json!({"passed": passed}));
            } else {
                for case in &passed {
                    println!("ok      {case}");
                }
                println!(
                    "{} of {} cases passed",
                    passed.len(),
                    CONFORMANCE_CASES.len()
                );
            }
            ExitCode::SUCCESS
        }
        Err(failure) => {
            if json {
                print_json(
                    &json!({"failed": failure.case, "code": failure.code.as_str(), "reason": failure.reason}),
                );
            } else {
                println!(
                    "FAILED  {} ({}): {}",
                    failure.case,
                    failure.code.as_str(),
                    printable(&failure.reason)
                );
            }
            ExitCode::FAILURE
        }
    }
}

/// Why a rule file could not be used.
enum LoadError {
    /// The file could not be read.
    Read(String),
    /// The file was read and refused, with every error.
    Rules(Vec<PolicyError>),
}

impl LoadError {
    fn lines(&self) -> Vec<String> {
        match self {
            LoadError::Read(e) => vec![e.clone()],
            LoadError::Rules(errors) => errors.iter().map(ToString::to_string).collect(),
        }
    }

    fn to_json(&self) -> Vec<Value> {
        match self {
            LoadError::Read(e) => vec![json!({"rule": null, "index": null, "line": null,
                "column": null, "span": null, "message": e})],
            LoadError::Rules(errors) => errors.iter().map(error_json).collect(),
        }
    }
}

/// Reads and checks a rule file.
fn load(file: &Path) -> Result<PolicySet, LoadError> {
    let text = read_text(file).map_err(LoadError::Read)?;
    PolicySet::from_yaml_str(&text).map_err(|e| LoadError::Rules(e.errors().to_vec()))
}

fn error_json(error: &PolicyError) -> Value {
    json!({
        "rule": error.rule_name(),
        "index": error.rule_index(),
        "line": error.location().map(|l| l.line),
        "column": error.location().map(|l| l.column),
        "span": error.condition_span().map(|s| [s.start, s.end]),
        "message": error.message(),
    })
}

fn check(file: &Path, json: bool) -> ExitCode {
    match (load(file), json) {
        (Ok(set), true) => {
            print_json(&json!({"valid": true, "rules": set.rules().len()}));
            ExitCode::SUCCESS
        }
        (Ok(set), false) => {
            println!("ok: {} rules", set.rules().len());
            ExitCode::SUCCESS
        }
        (Err(error), true) => {
            print_json(&json!({"valid": false, "errors": error.to_json()}));
            ExitCode::FAILURE
        }
        (Err(error), false) => {
            let lines = error.lines();
            for line in &lines {
                println!("error: {}", printable(line));
            }
            println!("{} error(s): the file is refused", lines.len());
            ExitCode::FAILURE
        }
    }
}

/// The params the manifests in `dirs` and, when `paired` is set, the
/// devices paired with the vessel of that data directory (or of dk's home)
/// declare; `None` when neither is asked for.
fn declared_params(
    dirs: &[PathBuf],
    paired: Option<Option<&Path>>,
) -> Result<Option<DeclaredParams>, String> {
    if dirs.is_empty() && paired.is_none() {
        return Ok(None);
    }
    let mut declared = DeclaredParams::new();
    let mut declare = |manifest: &dk_proto::Manifest| {
        for cap in manifest.capabilities() {
            declared.declare_device(manifest.id(), cap.name());
            for param in cap.params() {
                let ty = match param.ty() {
                    dk_proto::ParamType::String => InputType::String,
                    dk_proto::ParamType::Number => InputType::Number,
                    dk_proto::ParamType::Boolean => InputType::Boolean,
                };
                declared.declare(cap.name(), param.name(), ty);
            }
        }
    };
    for dir in dirs {
        let entries =
            std::fs::read_dir(dir).map_err(|e| format!("cannot read `{}`: {e}", dir.display()))?;
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
            .collect();
        paths.sort();
        for path in paths {
            let manifest = read_text(&path).and_then(|text| {
                dk_proto::validate_manifest_json(&text)
                    .map_err(|e| format!("`{}` is not a valid manifest: {e}", path.display()))
            })?;
            declare(&manifest);
        }
    }
    if let Some(data_dir) = paired {
        let (data_dir, _home) = data_dir_or_home(data_dir).map_err(|e| e.to_string())?;
        let store = crate::audit_cmd::open(&data_dir)?;
        let snapshot = dk_store::Store::load(&store).map_err(|e| e.to_string())?;
        for pairing in snapshot.pairings {
            let manifest =
                dk_proto::validate_manifest_json(&pairing.manifest_json).map_err(|e| {
                    format!("the manifest of paired device `{}`: {e}", pairing.device_id)
                })?;
            declare(&manifest);
        }
    }
    Ok(Some(declared))
}

fn lint(
    file: &Path,
    json: bool,
    deny_warnings: bool,
    declared: Option<&DeclaredParams>,
) -> ExitCode {
    let options = LintOptions {
        declared_params: declared,
    };
    let outcome = read_text(file).map_err(LoadError::Read).and_then(|text| {
        lint_yaml_str_with(&text, &options).map_err(|e| LoadError::Rules(e.errors().to_vec()))
    });
    let warnings = match (outcome, json) {
        (Ok(warnings), _) => warnings,
        (Err(error), true) => {
            print_json(&json!({"valid": false, "errors": error.to_json()}));
            return ExitCode::FAILURE;
        }
        (Err(error), false) => {
            let lines = error.lines();
            for line in &lines {
                println!("error: {}", printable(line));
            }
            println!("{} error(s): the file is refused", lines.len());
            return ExitCode::FAILURE;
        }
    };
    if json {
        let list: Vec<Value> = warnings.iter().map(warning_json).collect();
        print_json(&json!({"valid": true, "warnings": list}));
    } else {
        for warning in &warnings {
            println!("warning: {}", printable(&warning.to_string()));
        }
        println!("{} warning(s)", warnings.len());
    }
    if deny_warnings && !warnings.is_empty() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn warning_json(warning: &LintWarning) -> Value {
    let by = match &warning.kind {
        LintKind::Shadowed { by_index, by_name } => json!({"rule": by_name, "index": by_index}),
        _ => Value::Null,
    };
    json!({
        "kind": warning.kind.as_str(),
        "rule": warning.rule,
        "index": warning.index,
        "line": warning.location.map(|l| l.line),
        "by": by,
        "message": warning.message(),
    })
}

/// What `dk policy explain` is asked about.
struct Asked<'a> {
    context: &'a str,
    input: Option<&'a str>,
    at: Option<&'a str>,
    action: &'a str,
}

fn explain(file: &Path, asked: &Asked<'_>, json: bool) -> ExitCode {
    let set = match load(file) {
        Ok(set) => set,
        Err(error) => {
            for line in error.lines() {
                eprintln!("error: {}", printable(&line));
            }
            return ExitCode::FAILURE;
        }
    };
    let read = parse_context(asked.context, asked.action).and_then(|context| {
        let input = asked.input.map(parse_input).transpose()?;
        let at = asked
            .at
            .map(|at| {
                set.instant(at)
                    .map_err(|e| format!("--at {}", printable(&e.to_string())))
            })
            .transpose()?;
        if asked.action != DEVICE_USE && (input.is_some() || at.is_some()) {
            return Err(format!(
                "--input and --at describe a device call: they need --action {DEVICE_USE}"
            ));
        }
        Ok((context, input, at))
    });
    let (context, input, at) = match read {
        Ok(read) => read,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let field = |name: &str| context.get(name).map(String::as_str);
    let decision = if asked.action == DEVICE_USE {
        set.evaluate_call(&Call {
            device: DeviceUseContext {
                agent_id: field("agentId"),
                session_id: field("sessionId"),
                device_id: field("deviceId").unwrap_or(""),
                capability: field("capability").unwrap_or(""),
                capability_kind: field("capabilityKind").unwrap_or(""),
            },
            input: input.as_ref(),
            at: at.unwrap_or_else(SystemTime::now),
        })
    } else {
        set.evaluate(asked.action, &context)
    };
    if json {
        print_json(&json!({
            "decision": decision.kind().as_str(),
            "rule": decision.rule(),
            "reason": decision.reason(),
        }));
    } else {
        match (decision.rule(), decision.reason()) {
            (Some(rule), Some(reason)) => {
                println!(
                    "{} by rule `{rule}`: {}",
                    decision.kind().as_str(),
                    printable(reason)
                );
            }
            (None, Some(reason)) => println!("{}: {}", decision.kind().as_str(), printable(reason)),
            (Some(rule), None) => println!("{} by rule `{rule}`", decision.kind().as_str()),
            (None, None) => println!("{}: no rule matched", decision.kind().as_str()),
        }
    }
    ExitCode::SUCCESS
}

/// `--input`: a JSON object, as a call's input is.
fn parse_input(text: &str) -> Result<Map<String, Value>, String> {
    match serde_json::from_str(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err("--input must be a JSON object".to_owned()),
        Err(e) => Err(format!("--input is not JSON: {e}")),
    }
}

/// The context: a JSON object whose values are strings; for `device_use`,
/// only the fields such a call has (a misspelt key would read as missing and
/// quietly match nothing).
fn parse_context(text: &str, action: &str) -> Result<BTreeMap<String, String>, String> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("--context is not JSON: {e}"))?;
    let Value::Object(map) = value else {
        return Err("--context must be a JSON object".to_owned());
    };
    if action == DEVICE_USE
        && let Some(key) = map
            .keys()
            .find(|k| !DEVICE_USE_FIELDS.contains(&k.as_str()))
    {
        return Err(format!(
            "--context key `{}` is not a field of a device_use call: use {}",
            printable(key),
            DEVICE_USE_FIELDS.join(", ")
        ));
    }
    map.into_iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k, s)),
            _ => Err(format!(
                "--context value of `{}` must be a string",
                printable(&k)
            )),
        })
        .collect()
}
