//! Rule file tests: accepted files, every error reported with its place, limits.

use std::time::Instant;

use super::*;

const HEADER: &str = "version: 1\npolicies:\n";

/// Loads `text`, which must give rules with these names.
#[track_caller]
fn check_ok(text: &str, names: &[&str]) {
    let rules = load_str(text)
        .unwrap_or_else(|e| panic!("{text}\n{e}"))
        .rules;
    let got: Vec<&str> = rules.iter().map(Rule::name).collect();
    assert_eq!(got, names);
}

/// Loads `text`, which must be refused with exactly these lines.
#[track_caller]
fn check_err(text: &str, expected: &[&str]) {
    let error = match load_str(text) {
        Ok(rules) => panic!("{text}\nloaded {} rules", rules.rules.len()),
        Err(error) => error,
    };
    let shown = error.to_string();
    let got: Vec<&str> = shown.lines().collect();
    assert_eq!(got, expected, "{text}");
}

#[test]
fn accepted_files() {
    let cases: &[(&str, &[&str])] = &[
        ("version: 1\npolicies: []\n", &[]),
        (
            "version: 1\npolicies:\n  - name: ask-before-lamp-actions\n    action: device_use\n    condition: \"deviceId equals desk-lamp and capabilityKind equals actuator\"\n    decision: require_approval\n    message: \"Lamp actions need a yes\"\n",
            &["ask-before-lamp-actions"],
        ),
        (
            "version: 1\npolicies:\n  - {name: a, action: '*', condition: 'agentId equals x', decision: block, message: no, enabled: false, agentScope: '', environments: [dev, prod], immutable: true}\n  - {name: b, action: write_file, condition: 'path contains .env', decision: allow, message: '', enabled: ~, agentScope: ~}\n",
            &["a", "b"],
        ),
    ];
    for (text, names) in cases {
        check_ok(text, names);
    }
}

/// Values a device_use field can hold pass; any value passes for another
/// action, where the fields mean something else.
#[test]
fn device_use_values_that_can_match() {
    let conditions = [
        "deviceId equals Desk-Lamp-2 and capability in [Set_Light, read2]",
        "deviceId starts_with desk- or deviceId ends_with -lamp or deviceId contains -",
        "capability starts_with set_ or capability ends_with _on or capability contains 2_x",
        "capabilityKind equals SENSOR or capabilityKind starts_with act or capabilityKind contains ns",
        "agentId equals \"main helper\" and sessionId starts_with night-shift",
        "deviceId contains \"\" and capabilityKind ends_with \"\"",
    ];
    for condition in conditions {
        for action in ["device_use", "*"] {
            let text = format!(
                "{HEADER}  - {{name: a, action: '{action}', condition: '{condition}', decision: block, message: m}}\n"
            );
            check_ok(&text, &["a"]);
        }
    }
    for action in ["write_file", "device_usage", "use_device"] {
        let text = format!(
            "{HEADER}  - {{name: a, action: {action}, condition: 'deviceId equals \"front door\" or capabilityKind equals actuators', decision: block, message: m}}\n"
        );
        check_ok(&text, &["a"]);
    }
}

#[test]
fn rule_fields_are_kept() {
    let text = format!(
        "{HEADER}  - name: r\n    action: device_use\n    condition: \" deviceId equals x \"\n    decision: block\n    message: go away\n    agentScope: helper\n    enabled: true\n    environments: [dev]\n    immutable: true\n"
    );
    let rules = load_str(&text).unwrap().rules;
    let rule = &rules[0];
    assert_eq!(rule.index(), 0);
    assert_eq!(rule.action(), "device_use");
    assert_eq!(rule.decision(), RuleDecision::Block);
    assert_eq!(rule.message(), "go away");
    assert_eq!(rule.reason(), "[r] go away");
    assert_eq!(rule.agent_scope(), Some("helper"));
    assert!(rule.is_enabled());
    assert!(rule.is_immutable());
    assert_eq!(rule.environments(), ["dev".to_owned()]);
    assert_eq!(rule.condition_text(), " deviceId equals x ");
    assert_eq!(rule.condition().to_string(), "deviceId equals x");
    assert_eq!(rule.location(), None);
}

#[test]
fn refused_files() {
    let cases: &[(&str, &[&str])] = &[
        (
            "",
            &["a rule file is a mapping with `version: 1` and `policies`, found nothing"],
        ),
        (
            "- a\n",
            &["a rule file is a mapping with `version: 1` and `policies`, found a list"],
        ),
        ("version: 1\n", &["missing `policies`"]),
        ("policies: []\n", &["missing `version: 1`"]),
        (
            "version: '1'\npolicies: []\n",
            &["line 1 column 10: `version` must be 1, found a string"],
        ),
        (
            "version: 2\npolicies: {}\nextra: 1\n",
            &[
                "line 1 column 10: `version` must be 1, found 2",
                "line 2 column 11: `policies` must be a list of rules (`[]` for none), found a mapping",
                "line 3 column 1: unknown key `extra` (a rule file has `version`, `policies` and optionally `timezone`)",
            ],
        ),
        (
            "version: 1\npolicies:\n",
            &[
                "line 2 column 10: `policies` must be a list of rules (`[]` for none), found nothing",
            ],
        ),
        (
            "version: 1\nversion: 1\npolicies: []\n",
            &["line 2 column 1: duplicate key `version`"],
        ),
        (
            "version: 1\npolicies:\n  - 3\n  - {name: b, action: x, condition: 'a equals b', decision: allow, message: 1}\n",
            &[
                "line 3 column 5: policies[0]: a rule must be a mapping, found a number",
                "line 4 column 77: policies[1] `b`: `message` must be a string, found a number",
            ],
        ),
        (
            "version: 1\npolicies:\n  - name: a\n    action: device_use\n    condition: \"deviceId equals x and foo equals y\"\n    decision: block\n    message: m\n    colour: red\n  - name: a\n    action: device_use\n    condition: deviceId matches x\n    decision: maybe\n    enabled: \"no\"\n",
            &[
                "line 5 column 16: policies[0] `a`: condition bytes 22..25: unknown field `foo` for a device_use rule (expected deviceId, capability, capabilityKind, agentId, sessionId, input.<param>, time or weekday)",
                "line 8 column 5: policies[0] `a`: unknown key `colour` (expected name, action, condition, decision, message, enabled, agentScope, environments, immutable or limit)",
                "line 9 column 5: policies[1] `a`: missing `message`",
                "line 9 column 11: policies[1] `a`: duplicate rule name `a` (also policies[0])",
                "line 11 column 16: policies[1] `a`: condition bytes 9..16: unknown operator `matches` (expected equals, contains, starts_with, ends_with, in, or for `input.` fields >, >=, <, <=)",
                "line 12 column 15: policies[1] `a`: `decision` must be block, require_approval or allow, found `maybe`",
                "line 13 column 14: policies[1] `a`: `enabled` must be true or false, found a string",
            ],
        ),
        (
            "version: 1\npolicies:\n  - {name: '', action: '', condition: '', decision: Block, message: m, name: x}\n",
            &[
                "line 3 column 12: policies[0]: `name` must not be empty",
                "line 3 column 24: policies[0]: `action` must not be empty",
                "line 3 column 39: policies[0]: condition bytes 0..0: Empty condition",
                "line 3 column 53: policies[0]: `decision` must be block, require_approval or allow, found `Block`",
                "line 3 column 72: policies[0]: duplicate key `name`",
            ],
        ),
        (
            "version: 1\npolicies:\n  - {name: \"a\\nb\", action: x, condition: a has_secret, decision: block, message: m, environments: [1], 7: x}\n",
            &[
                "line 3 column 12: policies[0]: `name` must not hold control characters",
                "line 3 column 42: policies[0]: condition bytes 2..12: `has_secret` has no meaning for device calls and is not supported",
                "line 3 column 99: policies[0]: `environments` must be a list of strings, found a list",
                "line 3 column 104: policies[0]: keys must be strings, found a number",
            ],
        ),
        (
            "version: 1\npolicies:\n - name: [\n",
            &[
                "line 4 column 1: invalid yaml: did not find expected node content at line 4 column 1, while parsing a flow node",
            ],
        ),
        (
            "version: 1\npolicies:\n  - !tag {name: x}\n",
            &["line 3 column 5: yaml tags (`!name`) are not supported"],
        ),
        (
            "version: 1\npolicies: []\n---\nversion: 1\n",
            &[
                "invalid yaml: deserializing from YAML containing more than one document is not supported",
            ],
        ),
    ];
    for (text, expected) in cases {
        check_err(text, expected);
    }
}

#[test]
fn honest_aliases_are_fine() {
    check_ok(
        &format!(
            "{HEADER}  - &r {{name: a, action: x, condition: &c 'a equals b', decision: allow, message: &m m}}\n  - {{name: b, action: x, condition: *c, decision: block, message: *m}}\n"
        ),
        &["a", "b"],
    );
}

#[test]
fn errors_carry_their_parts() {
    let text = format!(
        "{HEADER}  - name: r\n    action: device_use\n    condition: deviceId equals x and bar equals y\n    decision: block\n    message: m\n"
    );
    let error = load_str(&text).unwrap_err();
    let [e] = error.errors() else {
        panic!("{error}")
    };
    assert_eq!(e.rule_index(), Some(0));
    assert_eq!(e.rule_name(), Some("r"));
    assert_eq!(
        e.location(),
        Some(Location {
            line: 5,
            column: 16
        })
    );
    assert_eq!(e.condition_span(), Some(22..25));
    assert!(e.message().starts_with("unknown field `bar`"));
}

#[test]
fn other_actions_may_read_any_field() {
    check_ok(
        &format!(
            "{HEADER}  - {{name: r, action: write_file, condition: 'path contains .env', decision: block, message: m}}\n"
        ),
        &["r"],
    );
    check_err(
        &format!(
            "{HEADER}  - {{name: r, action: '*', condition: 'path contains .env', decision: block, message: m}}\n"
        ),
        &[
            "line 3 column 39: policies[0] `r`: condition bytes 0..4: unknown field `path` for a device_use rule (expected deviceId, capability, capabilityKind, agentId, sessionId, input.<param>, time or weekday)",
        ],
    );
}

#[test]
fn limits() {
    let big = format!("{HEADER}# {}\n", "x".repeat(MAX_FILE_BYTES));
    check_err(&big, &["the file is larger than 4194304 bytes"]);

    let mut many = String::from(HEADER);
    for i in 0..=MAX_RULES {
        many.push_str(&format!(
            "- {{name: r{i}, action: a, condition: x equals y, decision: allow, message: m}}\n"
        ));
    }
    if many.len() <= MAX_FILE_BYTES {
        let error = load_str(&many).unwrap_err().to_string();
        assert!(
            error.ends_with("more than 100000 rules in one file"),
            "{error}"
        );
    }
    let mut compact = String::from("version: 1\npolicies: [");
    for _ in 0..=MAX_RULES {
        compact.push_str("a,");
    }
    compact.push(']');
    let error = load_str(&compact).unwrap_err().to_string();
    assert!(
        error.ends_with("more than 100000 rules in one file"),
        "{error}"
    );
}

#[test]
fn alias_bombs_stop_quickly() {
    // Deep: each level ten times the one before.
    let mut deep = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for level in 1..12 {
        let prev = level - 1;
        let refs = vec![format!("*a{prev}"); 10].join(", ");
        deep.push_str(&format!("a{level}: &a{level} [{refs}]\n"));
    }
    // Wide: a big list referenced many times (few alias jumps, many nodes).
    let items = vec!["x"; 20_000].join(", ");
    let refs = vec!["*w"; 2_000].join(", ");
    let wide = format!("w: &w [{items}]\nv: [{refs}]\n");
    // Long strings referenced many times.
    let long = format!(
        "s: &s \"{}\"\nt: [{}]\n",
        "y".repeat(100_000),
        vec!["*s"; 1_000].join(", ")
    );
    for (text, expected) in [
        (deep, "yaml nodes (an alias bomb?)"),
        (wide, "yaml nodes (an alias bomb?)"),
        (long, "bytes of text (an alias bomb?)"),
    ] {
        let started = Instant::now();
        let error = load_str(&text).unwrap_err().to_string();
        assert!(error.ends_with(expected), "{error}");
        // Not a timing assertion: shown for whoever reads the test output.
        println!("{expected}: refused in {:?}", started.elapsed());
    }
}

#[test]
fn limits_on_rules() {
    let text = format!(
        "{HEADER}  - {{name: unlocks, action: device_use, condition: 'capability equals unlock', decision: block, message: m, limit: 3 per 1h}}\n  - {{name: asks, action: '*', condition: 'capability equals open', decision: require_approval, message: m, limit: 10 per 1d}}\n  - {{name: plain, action: device_use, condition: 'capability equals open', decision: block, message: m, limit: ~}}\n"
    );
    let rules = load_str(&text).unwrap();
    let limits: Vec<Option<String>> = rules
        .rules
        .iter()
        .map(|r| r.limit().map(|l| l.to_string()))
        .collect();
    assert_eq!(
        limits,
        [
            Some("3 per 1h".to_owned()),
            Some("10 per 1d".to_owned()),
            None
        ]
    );

    let refused = [
        (
            "{name: a, action: device_use, condition: 'capability equals unlock', decision: allow, message: m, limit: 3 per 1h}",
            "policies[0] `a`: `limit` on an allow rule changes nothing",
        ),
        (
            "{name: a, action: write_file, condition: 'path contains x', decision: block, message: m, limit: 3 per 1h}",
            "policies[0] `a`: `limit` counts device calls",
        ),
        (
            "{name: a, action: device_use, condition: 'capability equals unlock', decision: block, message: m, limit: 3 an hour}",
            "policies[0] `a`: `limit` `3 an hour`: write `limit: N per <window>`",
        ),
        (
            "{name: a, action: device_use, condition: 'capability equals unlock', decision: block, message: m, limit: 3}",
            "policies[0] `a`: `limit` must be a string, found a number",
        ),
    ];
    for (rule, expected) in refused {
        let text = format!("{HEADER}  - {rule}\n");
        let shown = match load_str(&text) {
            Ok(_) => panic!("{text} loaded"),
            Err(error) => error.to_string(),
        };
        assert!(
            shown
                .lines()
                .any(|line| line.starts_with("line 3 column ") && line.contains(expected)),
            "{text}\n{shown}"
        );
    }
}

/// The new conditions: each refusal with its message, each file that loads.
#[test]
fn input_and_time_conditions() {
    let rule = |action: &str, condition: &str| {
        format!(
            "{HEADER}  - {{name: r, action: '{action}', condition: '{condition}', decision: block, message: m}}\n"
        )
    };
    check_ok(
        &rule(
            "device_use",
            "deviceId equals thermostat and (input.target > 25 or input.target < -3.5) and input.on equals true and time in 23:00..06:00 and weekday in [sat, SUN]",
        ),
        &["r"],
    );
    check_ok(
        &rule(
            "*",
            "input.mode in [eco, \"25\", 25] and weekday equals mon",
        ),
        &["r"],
    );
    // Other actions keep 8gent's meaning: `time` and `weekday` are fields like any.
    check_ok(
        &rule(
            "write_file",
            "time in [a, b] and weekday equals saturday and time equals x",
        ),
        &["r"],
    );
    check_ok("version: 1\ntimezone: Europe/Berlin\npolicies: []\n", &[]);
    let cases: &[(&str, &str, &str)] = &[
        (
            "device_use",
            "input.target > warm",
            "15..19: `input.target` expects a number: `>` compares numbers, so write one without quotes, as in `input.target > 25`",
        ),
        (
            "device_use",
            "input.target <= \"25\"",
            "16..20: `input.target` expects a number: `<=` compares numbers, so write one without quotes, as in `input.target <= 25`",
        ),
        (
            "device_use",
            "input.target > 1e999",
            "15..20: the number `1e999` is too large (at most about 1.8e308)",
        ),
        (
            "device_use",
            "deviceId > 5",
            "9..10: `>` compares numbers and applies only to `input.<param>` fields, as in `input.target > 25`",
        ),
        (
            "device_use",
            "input.a.b equals 1",
            "0..9: `input.a.b`: nested params are not supported; `input.<param>` names a top-level param of the call's input",
        ),
        (
            "device_use",
            "input.Target equals 1",
            "0..12: `Target` can never be a param name, so `input.Target` never matches: a param is lower case letters and digits in words joined by `_`, starting with a letter, at most 30 characters",
        ),
        (
            "device_use",
            "time in 7:00..08:00",
            "8..19: `7:00` is not a time from 00:00 to 23:59: write `time in HH:MM..HH:MM` with 24-hour times, as in `time in 23:00..06:00`",
        ),
        (
            "device_use",
            "time in 22:00..25:00",
            "8..20: `25:00` is not a time from 00:00 to 24:00: write `time in HH:MM..HH:MM` with 24-hour times, as in `time in 23:00..06:00`",
        ),
        (
            "device_use",
            "time equals 23:00",
            "0..4: `time equals` never matches a device call: `time` takes a window, as in `time in 23:00..06:00`",
        ),
        (
            "device_use",
            "weekday in [saturday]",
            "12..20: weekdays are written with three letters: write `sat`",
        ),
        (
            "device_use",
            "weekday equals someday",
            "15..22: `someday` is not a weekday, so this clause never matches: write one of mon, tue, wed, thu, fri, sat, sun",
        ),
        (
            "device_use",
            "weekday starts_with s",
            "0..7: `weekday starts_with`: a weekday is compared whole, as in `weekday in [sat, sun]` or `weekday equals mon`",
        ),
        (
            "device_use",
            "deviceId in []",
            "0..8: `deviceId in []` never matches, so the rule would do nothing: list at least one value, as in `deviceId in [desk-lamp]`, or remove the rule",
        ),
        (
            "*",
            "input.x in [ , ]",
            "0..7: `input.x in []` never matches, so the rule would do nothing: list at least one value, as in `input.x in [x]`, or remove the rule",
        ),
        (
            "write_file",
            "input.size > 5",
            "0..10: `input.` params exist only in device calls, so `input.size` never matches this action: use `action: device_use` (or `*`)",
        ),
        (
            "write_file",
            "time in 23:00..06:00",
            "0..4: time windows exist only in device calls, so `time` never matches this action: use `action: device_use` (or `*`)",
        ),
    ];
    for (action, condition, expected) in cases {
        let text = rule(action, condition);
        let column = 38 + action.len();
        let expected =
            format!("line 3 column {column}: policies[0] `r`: condition bytes {expected}");
        check_err(&text, &[&expected]);
    }
    check_err(
        "version: 1\ntimezone: Mars/Olympus\npolicies: []\n",
        &[
            "line 2 column 11: `timezone`: unknown time zone `Mars/Olympus` (write an IANA name such as `Europe/Berlin` or `UTC`)",
        ],
    );
    check_err(
        "version: 1\ntimezone: 5\npolicies: []\n",
        &[
            "line 2 column 11: `timezone` must be an IANA zone name such as `Europe/Berlin`, found a number",
        ],
    );
}
