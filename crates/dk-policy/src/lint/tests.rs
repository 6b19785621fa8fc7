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
                "`input.target`: no capability `set_mode` declares a param `target`, so the clause is always false",
            ],
        ),
        (
            "input.tempo > 25 or input.tempo < 3",
            &[
                "`input.tempo`: no capability declares a param `tempo`, so the clause is always false",
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
