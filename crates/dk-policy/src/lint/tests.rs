//! Lint cases: each a rule list and the warnings expected, as `index<-by_index`.

use super::*;

/// `(name, rules as (name, action, condition, decision, extra yaml), expected warnings)`.
type Case = (
    &'static str,
    &'static [(
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
    )],
    &'static [(usize, usize)],
);

const CASES: &[Case] = &[
    ("no rules", &[], &[]),
    (
        "equal condition, later block",
        &[
            ("a", "device_use", "deviceId equals lamp", "block", ""),
            ("b", "device_use", "deviceId equals lamp", "block", ""),
        ],
        &[(1, 0)],
    ),
    (
        "wider earlier block shadows a narrower later rule",
        &[
            ("a", "device_use", "deviceId equals lamp", "block", ""),
            (
                "b",
                "device_use",
                "capability equals on and deviceId equals lamp",
                "block",
                "",
            ),
        ],
        &[(1, 0)],
    ),
    (
        "narrower earlier block does not shadow",
        &[
            (
                "a",
                "device_use",
                "capability equals on and deviceId equals lamp",
                "block",
                "",
            ),
            ("b", "device_use", "deviceId equals lamp", "block", ""),
        ],
        &[],
    ),
    (
        "a later block never shadows an earlier block",
        &[
            (
                "a",
                "device_use",
                "capability equals on and deviceId equals lamp",
                "block",
                "",
            ),
            ("b", "device_use", "deviceId equals lamp", "block", ""),
            ("c", "device_use", "deviceId equals lamp", "block", ""),
        ],
        &[(2, 1)],
    ),
    (
        "a block anywhere shadows require_approval and allow",
        &[
            (
                "a",
                "device_use",
                "deviceId equals lamp and capability equals on",
                "require_approval",
                "",
            ),
            (
                "b",
                "device_use",
                "deviceId equals lamp and capability equals on",
                "allow",
                "",
            ),
            ("c", "device_use", "deviceId equals lamp", "block", ""),
        ],
        &[(0, 2), (1, 2)],
    ),
    (
        "require_approval never shadows",
        &[
            (
                "a",
                "device_use",
                "deviceId equals lamp",
                "require_approval",
                "",
            ),
            (
                "b",
                "device_use",
                "deviceId equals lamp",
                "require_approval",
                "",
            ),
        ],
        &[],
    ),
    (
        "or is not understood: no warning",
        &[
            (
                "a",
                "device_use",
                "deviceId equals lamp or deviceId equals fan",
                "block",
                "",
            ),
            ("b", "device_use", "deviceId equals lamp", "block", ""),
        ],
        &[],
    ),
    (
        "values compare exactly",
        &[
            ("a", "device_use", "deviceId equals Lamp", "block", ""),
            ("b", "device_use", "deviceId equals lamp", "block", ""),
        ],
        &[],
    ),
    (
        "parentheses and order do not matter",
        &[
            (
                "a",
                "device_use",
                "(capability equals on and deviceId equals lamp)",
                "block",
                "",
            ),
            (
                "b",
                "device_use",
                "deviceId equals lamp and (agentId equals x and capability equals on)",
                "block",
                "",
            ),
        ],
        &[(1, 0)],
    ),
    (
        "a disabled block shadows nothing, a disabled rule is not warned about",
        &[
            (
                "a",
                "device_use",
                "deviceId equals lamp",
                "block",
                "enabled: false",
            ),
            ("b", "device_use", "deviceId equals lamp", "block", ""),
            (
                "c",
                "device_use",
                "deviceId equals lamp",
                "block",
                "enabled: false",
            ),
        ],
        &[],
    ),
    (
        "another action does not shadow; `*` does",
        &[
            ("a", "other", "deviceId equals lamp", "block", ""),
            ("b", "device_use", "deviceId equals lamp", "block", ""),
            ("c", "*", "capability equals on", "block", ""),
            (
                "d",
                "device_use",
                "capability equals on",
                "require_approval",
                "",
            ),
            (
                "e",
                "*",
                "capability equals on and deviceId equals x",
                "allow",
                "",
            ),
        ],
        &[(3, 2), (4, 2)],
    ),
    (
        "a device_use block does not shadow a `*` rule",
        &[
            ("a", "device_use", "deviceId equals lamp", "block", ""),
            ("b", "*", "deviceId equals lamp", "block", ""),
        ],
        &[],
    ),
    (
        "agent scope: unscoped covers scoped, not the other way",
        &[
            (
                "a",
                "device_use",
                "deviceId equals lamp",
                "block",
                "agentScope: main",
            ),
            ("b", "device_use", "deviceId equals lamp", "block", ""),
            (
                "c",
                "device_use",
                "deviceId equals lamp",
                "block",
                "agentScope: main",
            ),
            (
                "d",
                "device_use",
                "deviceId equals fan",
                "block",
                "agentScope: main",
            ),
            (
                "e",
                "device_use",
                "deviceId equals fan",
                "block",
                "agentScope: other",
            ),
        ],
        &[(2, 0)],
    ),
    (
        "not is compared whole",
        &[
            ("a", "device_use", "not deviceId equals lamp", "block", ""),
            (
                "b",
                "device_use",
                "capability equals on and not deviceId equals lamp",
                "block",
                "",
            ),
            (
                "c",
                "device_use",
                "not (deviceId equals lamp and capability equals on)",
                "block",
                "",
            ),
        ],
        &[(1, 0)],
    ),
];

fn yaml(rules: &[(&str, &str, &str, &str, &str)]) -> String {
    let mut text = String::from("version: 1\npolicies:\n");
    if rules.is_empty() {
        text = String::from("version: 1\npolicies: []\n");
    }
    for (name, action, condition, decision, extra) in rules {
        text.push_str(&format!(
            "  - name: {name}\n    action: \"{action}\"\n    condition: \"{condition}\"\n    decision: {decision}\n    message: m\n"
        ));
        if !extra.is_empty() {
            text.push_str(&format!("    {extra}\n"));
        }
    }
    text
}

#[test]
fn lint_cases() {
    for (name, rules, expected) in CASES {
        let text = yaml(rules);
        let set = crate::PolicySet::from_yaml_str(&text).unwrap();
        let got: Vec<(usize, usize)> = lint(set.rules())
            .iter()
            .filter_map(|w| match &w.kind {
                LintKind::Shadowed { by_index, .. } => Some((w.index, *by_index)),
                _ => None,
            })
            .collect();
        assert_eq!(&got, expected, "{name}");
    }
}

#[test]
fn lint_yaml_str_gives_lines_and_messages() {
    let text = yaml(&[
        ("a", "device_use", "deviceId equals lamp", "block", ""),
        (
            "b",
            "device_use",
            "deviceId equals lamp",
            "require_approval",
            "",
        ),
    ]);
    let warnings = lint_yaml_str(&text).unwrap();
    let lines: Vec<String> = warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            "line 8: policies[1] `b`: never decides: block rule `a` (policies[0]) matches every call it matches"
        ]
    );
    assert_eq!(warnings[0].rule, "b");
    assert_eq!(warnings[0].kind.as_str(), "shadowed");
}

#[test]
fn lint_yaml_str_refuses_a_broken_file() {
    let text = yaml(&[
        ("a", "device_use", "deviceId equals lamp", "block", ""),
        ("a", "device_use", "deviceId equals lamp", "block", ""),
    ]);
    let error = lint_yaml_str(&text).unwrap_err();
    assert!(
        error.to_string().contains("duplicate rule name `a`"),
        "{error}"
    );
}

/// Input params against the params devices declare, and empty windows:
/// `(condition, expected warning messages)`.
#[test]
fn input_params_and_time_windows() {
    let mut declared = DeclaredParams::new();
    declared.declare("set_target", "target", InputType::Number);
    declared.declare("set_mode", "mode", InputType::String);
    declared.declare("set_mode", "boost", InputType::Boolean);
    let options = LintOptions {
        declared_params: Some(&declared),
    };
    let cases: &[(&str, &[&str])] = &[
        ("input.target > 25 and input.mode equals eco", &[]),
        ("capability equals set_target and input.target > 25", &[]),
        (
            "capability equals set_mode and input.target > 25",
            &[
                "`input.target`: no capability `set_mode` declares a param `target` (declared: `boost`, `mode`), so the clause is always false",
            ],
        ),
        (
            "input.tempo > 25 or input.tempo < 3",
            &[
                "`input.tempo`: no capability declares a param `tempo` (declared: `boost`, `mode`, `target`), so the clause is always false",
            ],
        ),
        (
            "input.target equals warm",
            &[
                "`input.target` is compared with text, but it is declared a number, so the clause is always false",
            ],
        ),
        (
            "input.mode > 3 and input.boost equals yes and input.boost in [true, x]",
            &[
                "`input.mode` is compared with a number, but it is declared a string, so the clause is always false",
                "`input.boost` is compared with text, but it is declared a boolean, so the clause is always false",
            ],
        ),
        (
            "time in 10:00..10:00 or time in 00:00..24:00",
            &[
                "`time in 10:00..10:00` is an empty window (it starts where it ends), so the clause is always false: write `time in 00:00..24:00` for the whole day",
            ],
        ),
    ];
    for (condition, expected) in cases {
        let text = yaml(&[("r", "device_use", condition, "block", "")]);
        let got: Vec<String> = lint_yaml_str_with(&text, &options)
            .unwrap()
            .iter()
            .map(LintWarning::message)
            .collect();
        assert_eq!(got, *expected, "{condition}");
    }
    // Without declared params only the window is checked.
    let text = yaml(&[("r", "device_use", "input.tempo > 25", "block", "")]);
    assert_eq!(lint_yaml_str(&text).unwrap(), []);
}

/// With the devices known (`--paired`), a `deviceId` or `capability` none
/// of them has is named, with what there is: `(condition, expected)`.
#[test]
fn device_ids_and_capabilities_no_known_device_has() {
    let mut declared = DeclaredParams::new();
    declared.declare_device("hall-thermostat", "read_temperature");
    declared.declare_device("hall-thermostat", "set_target");
    declared.declare("set_target", "celsius", InputType::Number);
    declared.declare_device("desk-lamp", "set_light");
    let options = LintOptions {
        declared_params: Some(&declared),
    };
    let devices = "(devices: `desk-lamp`, `hall-thermostat`)";
    let cases: &[(&str, &[String])] = &[
        (
            "deviceId equals hall-thermostat and capability equals set_target and input.celsius > 25",
            &[],
        ),
        ("capability in [set_light, set_target]", &[]),
        (
            "deviceId equals hall-thermostate and capability equals set_target",
            &[format!(
                "`deviceId` `hall-thermostate`: no device has this id {devices}, so the clause never holds for it"
            )],
        ),
        (
            "deviceId equals hall-thermostat and capability equals set_targt",
            &["`capability` `set_targt`: device `hall-thermostat` has no such capability (capabilities: `read_temperature`, `set_target`), so the clause never holds for it".to_owned()],
        ),
        (
            "deviceId equals hall-thermostat and capability equals set_light",
            &["`capability` `set_light`: device `hall-thermostat` has no such capability (capabilities: `read_temperature`, `set_target`), so the clause never holds for it".to_owned()],
        ),
        (
            "capability equals unlock",
            &["`capability` `unlock`: no device has this capability (capabilities: `read_temperature`, `set_light`, `set_target`), so the clause never holds for it".to_owned()],
        ),
        (
            "deviceId in [desk-lamp, front-door] and capability equals set_target and input.target > 25",
            &[
                format!("`deviceId` `front-door`: no device has this id {devices}, so the clause never holds for it"),
                "`capability` `set_target`: device `desk-lamp` has no such capability (capabilities: `set_light`), so the clause never holds for it".to_owned(),
                "`input.target`: no capability `set_target` declares a param `target` (declared: `celsius`), so the clause is always false".to_owned(),
            ],
        ),
        // Not required (under `or`, `not`): nothing is sure.
        ("deviceId equals nowhere or capability equals set_light", &[]),
    ];
    for (condition, expected) in cases {
        let text = yaml(&[("r", "device_use", condition, "block", "")]);
        let got: Vec<String> = lint_yaml_str_with(&text, &options)
            .unwrap()
            .iter()
            .map(LintWarning::message)
            .collect();
        assert_eq!(got, *expected, "{condition}");
    }
    // Another action's rule is not about devices.
    let text = yaml(&[("r", "shell", "deviceId equals nowhere", "block", "")]);
    assert_eq!(lint_yaml_str_with(&text, &options).unwrap(), []);
}
