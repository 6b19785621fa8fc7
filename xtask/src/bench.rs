//! `cargo xtask bench [FILTER] [--save FILE]`: runs the benchmarks and
//! prints the median of each, read from divan's tables, followed by the lines
//! of the benches that measure in their own way (`e2e/...`, `idle/...`,
//! `store/...`, `durable/...`, `desktop/...`: a tool call over WebSocket
//! against a bare echo, the memory of a vessel process with idle devices,
//! committed store writes with their p99, the durable vessel's start,
//! admin changes and call path, and the desktop device's screenshot, click
//! and memory against their limits, end to end and on the device alone).
//! `cargo xtask bench fleet` runs only the fleet bench (`fleet/...`: one
//! vessel with 10,000 dk/2 devices), which the other runs skip;
//! `cargo xtask bench fleet-routed` runs only the bench of three vessels as
//! one fleet (`fleet-routed/...`: a routed call against a local one, and
//! the fleet's throughput beside one vessel's), which they skip too;
//! `cargo xtask bench fleet-scale` runs only the bench of three members of
//! 10,000 lamps each (`fleet-scale/...`: presence, routing, a 300 KiB
//! answer, a member killed), which they skip as well.
//! `cargo xtask bench gate` runs only the MCP bridge's bench (`gate/...`:
//! a tool of the everything server called directly over stdio and through
//! dk, and a 500 KiB result both ways), which they skip as well.
//! `cargo xtask bench python` runs only the Python device SDK's bench
//! (`python/...`: a call's round trip through a vessel to a Python device
//! against the same to dk-device's Rust client, on the SDK's release
//! wheel), which they skip too.
//! `cargo xtask bench verify-pg` runs only `dk audit verify --store` on a
//! PostgreSQL log of 1,000,000 entries (`verify-pg/...`: its time and peak
//! memory, and at a tenth of the size), which they skip as well.
//! `cargo xtask bench voice` runs only the voice device's bench
//! (`voice/...`: a `listen_stream` chunk's latency beyond its own duration,
//! `say`'s start, the device process's CPU while streaming and its memory,
//! on a PulseAudio server of its own).
//! Times are reported, never asserted on.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use crate::run::{Stream, cargo, describe, tee};
use crate::{TaskError, TaskResult};

/// The packages whose benchmarks run.
const PACKAGES: [&str; 9] = [
    "dk-proto",
    "dk-policy",
    "dk-channel",
    "dk-store",
    "dk-core",
    "dk-vessel",
    "dk-tests",
    "dk",
    "dk-desktop",
];

/// How the lines of the benches without divan begin; each such line is kept
/// for the summary as it is.
const REPORT_PREFIXES: [&str; 15] = [
    "gate/",
    "fleet-scale/",
    "python/",
    "fleet/",
    "fleet-routed/",
    "verify-pg/",
    "e2e/",
    "idle/",
    "store/",
    "durable/",
    "console/",
    "bridge/",
    "firmware/",
    "desktop/",
    "voice/",
];

/// Open files the benches need: the idle-devices bench holds 1,000 device
/// connections in its own process and in the vessel it starts.
const OPEN_FILES: u64 = 4096;

/// Open files the fleet benches need: up to 30,000 lamps in its own process
/// and as many connections in the vessels, with a margin.
const FLEET_OPEN_FILES: u64 = 65_536;

/// Runs the benchmarks, then prints (and optionally saves) their medians.
pub fn run(args: &[String]) -> TaskResult {
    let mut filter: Option<&str> = None;
    let mut save: Option<PathBuf> = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--save" => {
                let file = args
                    .next()
                    .ok_or_else(|| TaskError("`--save` needs a file name".to_owned()))?;
                save = Some(PathBuf::from(file));
            }
            other if other.starts_with("--") => {
                return Err(TaskError(format!(
                    "unknown option `{other}` (expected `--save FILE`)"
                )));
            }
            other if filter.is_none() => filter = Some(other),
            other => return Err(TaskError(format!("one filter only; `{other}` is a second"))),
        }
    }

    let fleet = filter.is_some_and(|f| f.starts_with("fleet"));
    let mut command = with_open_files(cargo(), if fleet { FLEET_OPEN_FILES } else { OPEN_FILES });
    command.arg("bench");
    if filter == Some("fleet-scale") {
        // Three members of 10,000 lamps each on PostgreSQL and NATS:
        // minutes, on demand.
        command.args(["-p", "dk", "--bench", "fleet_scale"]);
    } else if filter == Some("fleet-routed") {
        // Three vessels as one fleet on PostgreSQL and NATS, with 9,000
        // lamps: minutes, on demand.
        command.args(["-p", "dk", "--bench", "fleet_routed"]);
    } else if fleet {
        // One vessel at fleet scale alone (`fleet`, or one part of it:
        // `fleet/scale`, `fleet/calls`): minutes, on demand.
        command.args(["-p", "dk", "--bench", "fleet"]);
    } else if filter == Some("verify-pg") {
        // A log of 1,000,000 entries written to PostgreSQL, then verified
        // by `dk audit verify --store`: minutes, on demand.
        command.args(["-p", "dk", "--bench", "verify_pg"]);
    } else if filter == Some("gate") {
        // The MCP bridge against its servers, direct and through dk: on
        // demand, with the servers `cargo xtask peers` installs.
        command.args(["-p", "dk", "--bench", "gate"]);
    } else if filter == Some("python") {
        // A Python device's call round trip against the Rust client's, on
        // the SDK's release wheel installed in a fresh virtualenv.
        let python = crate::python::virtualenv()?;
        let device = crate::python::sdk_virtualenv(&python, crate::python::Profile::Release)?;
        command.args(["-p", "dk-tests", "--bench", "python_device"]);
        command.env("DK_BENCH_DEVICE_PYTHON", device);
    } else if filter == Some("firmware") {
        // The firmware's budgets alone (the C lamp against a vessel), without
        // building every other bench.
        command.args(["-p", "dk-tests", "--bench", "firmware"]);
    } else if filter == Some("voice") {
        // The voice device alone, without building every other bench: a
        // vessel, the device in a process of its own, a PulseAudio server.
        command.args(["-p", "dk-tests", "--bench", "voice"]);
    } else if filter == Some("desktop") {
        // The desktop device alone, without building every other bench:
        // end to end (on an Xvfb, with a real vessel and an MCP agent) and
        // the device's own calls.
        command.args(["-p", "dk", "-p", "dk-desktop", "--bench", "desktop"]);
    } else {
        for package in PACKAGES {
            command.args(["-p", package]);
        }
        // Only the divan bench targets: libtest's unit-test binaries have
        // no benchmarks. The fleet bench runs only when named.
        command.args(["--bench", "*"]);
        command.env("DK_FLEET_SKIP", "1");
        command.env("DK_VERIFY_PG_SKIP", "1");
        command.env("DK_GATE_SKIP", "1");
    }
    if let Some(filter) = filter {
        command.args(["--", filter]);
    }

    let mut parser = DivanParser::default();
    let mut reports = Reports::default();
    let passed = tee("bench", &mut command, Stream::Stdout, |line| {
        parser.add_line(line);
        reports.add_line(line);
    })?;
    if !passed {
        return Err(TaskError(format!("bench failed: `{}`", describe(&command))));
    }
    let mut medians = parser.medians;
    medians.extend(reports.medians);
    if reports.lines.is_empty() || !medians.is_empty() {
        println!("\n{}", table(&medians));
    }
    if !reports.lines.is_empty() {
        println!("{}", reports.lines.join("\n"));
    }
    if let Some(file) = save {
        std::fs::write(&file, json(&medians))
            .map_err(|error| TaskError(format!("cannot write `{}`: {error}", file.display())))?;
        println!("saved {} medians to `{}`", medians.len(), file.display());
    }
    Ok(())
}

/// The median of one benchmark, as divan printed it.
#[derive(Debug, Clone, PartialEq)]
pub struct Median {
    /// The benchmark's path: binary, function, then arguments, joined by `/`.
    pub name: String,
    /// The median as printed, such as `170.1 ns`.
    pub text: String,
    /// The median in nanoseconds, when its unit is known.
    pub nanos: Option<f64>,
}

/// Reads divan's output line by line, keeping the median of every leaf.
///
/// Divan prints one tree per bench binary: a header line naming the binary and
/// the columns `fastest │ slowest │ median │ mean │ samples │ iters`, then one
/// line per function, argument or leaf, indented with `│  `, `├─ ` and `╰─ `.
/// The five rightmost `│` separate the columns; the tree's own `│` come before.
#[derive(Debug, Default)]
pub struct DivanParser {
    /// The names from the binary down to the current line's parent.
    path: Vec<String>,
    /// Whether a header line has been seen, so lines are table rows.
    in_table: bool,
    /// The medians found so far.
    pub medians: Vec<Median>,
}

/// Characters divan draws the tree with.
const TREE_CHARS: [char; 5] = ['│', '├', '╰', '─', ' '];

impl DivanParser {
    /// Takes one line of output.
    pub fn add_line(&mut self, line: &str) {
        let columns: Vec<&str> = line.rsplitn(6, '│').collect();
        // rsplitn yields from the right: iters, samples, mean, median, slowest, rest.
        let [_iters, _samples, _mean, median, _slowest, first] = columns.as_slice() else {
            if !line.trim().is_empty() {
                // Any other output ("Timer precision", libtest) ends a table.
                self.in_table = false;
            }
            return;
        };
        let median = median.trim();
        if median == "median" {
            let name = first
                .trim_end()
                .strip_suffix("fastest")
                .unwrap_or(first)
                .trim();
            self.path = vec![name.to_owned()];
            self.in_table = true;
            return;
        }
        if !self.in_table {
            return;
        }
        let indent = first.chars().take_while(|c| TREE_CHARS.contains(c)).count();
        let rest: String = first.chars().skip(indent).collect();
        let name = strip_value(rest.trim_end()).trim();
        if name.is_empty() {
            // A second row for the same leaf, such as a throughput.
            return;
        }
        let depth = (indent / 3).max(1);
        self.path.truncate(depth);
        self.path.push(name.to_owned());
        if median.chars().any(|c| c.is_ascii_digit()) {
            self.medians.push(Median {
                name: self.path.join("/"),
                text: median.to_owned(),
                nanos: nanos(median),
            });
        }
    }
}

/// Keeps the lines of the benches that print their own results, such as
/// `e2e/bare_websocket_echo   median  40.1 µs   p99  70.3 µs` or
/// `idle/1000_devices  rss 38.2 MiB ...`, and the median of each line that
/// has one in a unit of time.
#[derive(Debug, Default)]
pub struct Reports {
    /// The lines, as printed.
    pub lines: Vec<String>,
    /// The medians found in them.
    pub medians: Vec<Median>,
}

impl Reports {
    /// Takes one line of output.
    pub fn add_line(&mut self, line: &str) {
        if !REPORT_PREFIXES.iter().any(|p| line.starts_with(p)) {
            return;
        }
        self.lines.push(line.trim_end().to_owned());
        let mut words = line.split_whitespace();
        let Some(name) = words.next() else {
            return;
        };
        if words.by_ref().any(|word| word == "median") {
            let (Some(number), Some(unit)) = (words.next(), words.next()) else {
                return;
            };
            let text = format!("{number} {unit}");
            if let Some(nanos) = nanos(&text) {
                self.medians.push(Median {
                    name: name.to_owned(),
                    text,
                    nanos: Some(nanos),
                });
            }
        }
    }
}

/// `command`, run with its soft limit on open files raised to `wanted` (the
/// hard limit raised first where that is allowed, as for root; else to the
/// hard limit, if lower) when this process's is below it. The limit is per
/// process and inherited, and only a shell can raise it without unsafe
/// code.
fn with_open_files(command: Command, wanted: u64) -> Command {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let soft = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .and_then(|line| line.split_whitespace().nth(3))
        .and_then(|soft| soft.parse::<u64>().ok());
    if soft.is_none_or(|soft| soft >= wanted) {
        return command;
    }
    let mut shell = Command::new("bash");
    shell.arg("-c").arg(format!(
        "ulimit -Hn {wanted} 2>/dev/null; ulimit -Sn {wanted} 2>/dev/null || ulimit -Sn \"$(ulimit -Hn)\"; exec \"$@\""
    ));
    shell.arg("bash").arg(command.get_program());
    shell.args(command.get_args());
    if let Some(dir) = command.get_current_dir() {
        shell.current_dir(dir);
    }
    for (key, value) in command.get_envs() {
        match value {
            Some(value) => shell.env(key, value),
            None => shell.env_remove(key),
        };
    }
    shell
}

/// Removes a trailing value such as `170.1 ns` or `5.8 GB/s` from a name column.
fn strip_value(text: &str) -> &str {
    let mut words = text.rsplitn(3, char::is_whitespace);
    let (Some(unit), Some(number)) = (words.next(), words.next()) else {
        return text;
    };
    let is_number = number.parse::<f64>().is_ok();
    let is_unit = !unit.is_empty() && !unit.chars().any(|c| c.is_ascii_digit());
    if is_number && is_unit {
        words.next().unwrap_or("")
    } else {
        text
    }
}

/// A printed duration in nanoseconds, such as `1.5 µs` -> 1500.
fn nanos(text: &str) -> Option<f64> {
    let mut words = text.split_whitespace();
    let number: f64 = words.next()?.parse().ok()?;
    let scale = match words.next()? {
        "ps" => 0.001,
        "ns" => 1.0,
        "µs" | "us" => 1_000.0,
        "ms" => 1_000_000.0,
        "s" => 1_000_000_000.0,
        _ => return None,
    };
    Some(number * scale)
}

/// The medians as a two-column text table.
fn table(medians: &[Median]) -> String {
    let width = medians
        .iter()
        .map(|m| m.name.chars().count())
        .max()
        .unwrap_or(0)
        .max(9);
    let mut text = format!("{:<width$}  median\n", "benchmark");
    for median in medians {
        let _ = writeln!(text, "{:<width$}  {}", median.name, median.text);
    }
    if medians.is_empty() {
        text.push_str("(no benchmark medians found in the output)\n");
    }
    text
}

/// The medians as JSON: `{"benchmarks": [{"name", "median", "median_ns"}]}`.
fn json(medians: &[Median]) -> String {
    let mut text = String::from("{\n  \"benchmarks\": [");
    for (i, median) in medians.iter().enumerate() {
        let separator = if i == 0 { "" } else { "," };
        let nanos = median
            .nanos
            .map_or_else(|| "null".to_owned(), |n| format!("{n}"));
        let _ = write!(
            text,
            "{separator}\n    {{\"name\": {}, \"median\": {}, \"median_ns\": {nanos}}}",
            json_string(&median.name),
            json_string(&median.text),
        );
    }
    text.push_str("\n  ]\n}\n");
    text
}

/// A JSON string literal.
fn json_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::{DivanParser, Reports, json, nanos};

    #[track_caller]
    fn check(output: &str, expected: &[(&str, &str)]) {
        let mut parser = DivanParser::default();
        for line in output.lines() {
            parser.add_line(line);
        }
        let got: Vec<(&str, &str)> = parser
            .medians
            .iter()
            .map(|m| (m.name.as_str(), m.text.as_str()))
            .collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn divan_tables() {
        check("", &[]);
        check(
            "\
     Running benches/proto.rs (target/release/deps/proto-0123)
Timer precision: 20 ns
proto                      fastest       │ slowest       │ median        │ mean          │ samples │ iters
├─ check_lamp_input        101.2 ns      │ 130.5 ns      │ 104.1 ns      │ 105 ns        │ 100     │ 6400
╰─ parse_tool_name_lamp    20.1 ns       │ 25.2 ns       │ 21 ns         │ 21.3 ns       │ 100     │ 25600
",
            &[("proto/check_lamp_input", "104.1 ns"), ("proto/parse_tool_name_lamp", "21 ns")],
        );
        check(
            "\
Timer precision: 20 ns
policy                            fastest       │ slowest       │ median        │ mean          │ samples │ iters
├─ evaluate_device_use_match                    │               │               │               │         │
│  ├─ 10                          51.2 ns       │ 60 ns         │ 52.5 ns       │ 53 ns         │ 100     │ 12800
│  ╰─ 10000                       1.2 µs        │ 2 µs          │ 1.25 µs       │ 1.3 µs        │ 100     │ 800
╰─ parse_file                                   │               │               │               │         │
   ╰─ 1000                        2.5 ms        │ 3 ms          │ 2.6 ms        │ 2.7 ms        │ 100     │ 100
                                  5.8 GB/s      │ 4.1 GB/s      │ 5.2 GB/s      │ 5 GB/s        │         │
",
            &[
                ("policy/evaluate_device_use_match/10", "52.5 ns"),
                ("policy/evaluate_device_use_match/10000", "1.25 µs"),
                ("policy/parse_file/1000", "2.6 ms"),
            ],
        );
    }

    #[test]
    fn report_lines() {
        let mut reports = Reports::default();
        let output = "\
     Running benches/e2e.rs (target/release/deps/e2e-0123)
e2e: 5000 rounds of each
e2e/tool_call_over_websocket    median    48.2 µs   p99    95.0 µs
e2e/bare_websocket_echo         median    40.1 µs   p99    70.3 µs
e2e/ratio                       median    1.20x     p99    1.35x
idle/1000_devices       rss 38.2 MiB  baseline 6.1 MiB  per device 32.1 KiB
durable: a vessel over its SQLite store
durable/admin_grant_committed           median  733.82 µs   p99    4.43 ms   min 424.72 µs max 8.05 ms  (500 samples)
durable/execute_ratio                   sqlite/memory 0.988x   target within 1.10x: within
";
        for line in output.lines() {
            reports.add_line(line);
        }
        assert_eq!(reports.lines.len(), 6);
        let medians: Vec<(&str, &str, Option<f64>)> = reports
            .medians
            .iter()
            .map(|m| (m.name.as_str(), m.text.as_str(), m.nanos))
            .collect();
        assert_eq!(
            medians,
            [
                ("e2e/tool_call_over_websocket", "48.2 µs", Some(48_200.0)),
                ("e2e/bare_websocket_echo", "40.1 µs", Some(40_100.0)),
                (
                    "durable/admin_grant_committed",
                    "733.82 µs",
                    Some(733_820.0)
                ),
            ]
        );
    }

    #[test]
    fn units() {
        assert_eq!(nanos("1.5 µs"), Some(1500.0));
        assert_eq!(nanos("2 ms"), Some(2_000_000.0));
        assert_eq!(nanos("3 ns"), Some(3.0));
        assert_eq!(nanos("5 GB/s"), None);
    }

    #[test]
    fn json_output() {
        let medians = vec![super::Median {
            name: "a/\"b\"".into(),
            text: "3 ns".into(),
            nanos: Some(3.0),
        }];
        assert_eq!(
            json(&medians),
            "{\n  \"benchmarks\": [\n    {\"name\": \"a/\\\"b\\\"\", \"median\": \"3 ns\", \"median_ns\": 3}\n  ]\n}\n"
        );
    }
}
