//! The macOS readers against what `ioreg` and `pmset` printed on real Macs
//! (M1 to M5 Pro and Intel, OS X 10.11 to macOS 26): every capture in
//! `tests/fixtures/macos/`, the source it feeds and what that source must
//! give. Each file's first line (`# source: …`) says where the text came
//! from and how it was cut; the rest is the tool's text, fed as it is. The
//! expected values were written from reading the captures.

use std::path::PathBuf;

use super::macos;
use super::policy::Policy;
use super::signal::Observation;

/// What a source must give for a capture, or for one part of it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Want {
    /// A number: seconds for `hid-idle`, percent for `gpu-util`.
    Num(f64),
    /// Yes or no.
    Flag(bool),
    /// The capture cannot say (cut before the value, an error, a Mac
    /// without the setting).
    Unknown,
}

use Want::{Flag, Num, Unknown};

/// Every capture: file, source, and what each part must give. A file with
/// several parts holds them apart by `--` lines, or else one a line.
const CAPTURES: &[(&str, &str, &[Want])] = &[
    // `HIDIdleTime` in ns, as seconds; above 2^32 is common.
    ("ioreg-hididle-1.txt", "hid-idle", &[Num(3254.341351)]),
    ("ioreg-hididle-2.txt", "hid-idle", &[Num(164.247344708)]),
    ("ioreg-hididle-3.txt", "hid-idle", &[Num(0.194607375)]),
    ("ioreg-hididle-4.txt", "hid-idle", &[Num(9.60769)]),
    ("ioreg-hididle-5.txt", "hid-idle", &[Num(6.061404721)]),
    // Plain `ioreg -c IOHIDSystem`: tree prefixes of several depths.
    (
        "ioreg-hididle-lines-plain-c.txt",
        "hid-idle",
        &[
            Num(13.231015208),
            Num(0.462824375),
            Num(40.958666),
            Num(5.0),
        ],
    ),
    // `"Device Utilization %"` in the node's own `PerformanceStatistics`.
    ("ioreg-accel-agx-1.txt", "gpu-util", &[Num(2.0)]),
    ("ioreg-accel-agx-2.txt", "gpu-util", &[Num(25.0)]),
    ("ioreg-accel-agx-3.txt", "gpu-util", &[Num(0.0)]),
    ("ioreg-accel-agx-4.txt", "gpu-util", &[Num(34.0)]),
    ("ioreg-accel-agx-5.txt", "gpu-util", &[Num(30.0)]),
    ("ioreg-accel-agx-6.txt", "gpu-util", &[Num(27.0)]),
    ("ioreg-accel-agx-7.txt", "gpu-util", &[Num(33.0)]),
    ("ioreg-accel-agx-8.txt", "gpu-util", &[Num(94.0)]),
    // Cut before `PerformanceStatistics`.
    ("ioreg-accel-amd-1.txt", "gpu-util", &[Unknown]),
    ("ioreg-accel-intel-1.txt", "gpu-util", &[Unknown]),
    // AMD: `"GPU Activity(%)"` only.
    ("ioreg-accel-amd-2.txt", "gpu-util", &[Num(2.0)]),
    ("ioreg-root-locked-1.txt", "screen-lock", &[Flag(true)]),
    // The console session without `CGSSessionScreenIsLocked`.
    ("ioreg-root-unlocked-1.txt", "screen-lock", &[Flag(false)]),
    ("ioreg-root-unlocked-2.txt", "screen-lock", &[Flag(false)]),
    // The display's power state alone says nothing of the lock.
    ("ioreg-displaywrangler-1.txt", "screen-lock", &[Unknown]),
    // `Now drawing from '…'`, with or without `(id=…)` and `present:
    // true`, from `-g batt` or `-g ps`, TABs turned into spaces.
    ("pmset-batt-ac-1.txt", "power", &[Flag(false)]),
    ("pmset-batt-ac-2.txt", "power", &[Flag(false)]),
    ("pmset-batt-ac-3.txt", "power", &[Flag(false)]),
    ("pmset-batt-ac-4.txt", "power", &[Flag(false)]),
    ("pmset-batt-ac-5.txt", "power", &[Flag(false)]),
    ("pmset-batt-ac-6.txt", "power", &[Flag(false)]),
    (
        "pmset-batt-ac-7.txt",
        "power",
        &[Flag(false), Flag(false), Flag(false)],
    ),
    ("pmset-batt-battery-1.txt", "power", &[Flag(true)]),
    ("pmset-batt-battery-2.txt", "power", &[Flag(true)]),
    (
        "pmset-batt-battery-3.txt",
        "power",
        &[Flag(true), Flag(true)],
    ),
    (
        "pmset-batt-battery-4.txt",
        "power",
        &[Flag(true), Flag(false)],
    ),
    ("pmset-batt-battery-5.txt", "power", &[Flag(true)]),
    ("pmset-batt-battery-6.txt", "power", &[Flag(true)]),
    // A desktop prints the source line alone.
    ("pmset-batt-desktop-1.txt", "power", &[Flag(false)]),
    // The summary cut: Amphetamine's per-process display assertion says it.
    (
        "pmset-assertions-amphetamine-1.txt",
        "assertions",
        &[Flag(true)],
    ),
    ("pmset-assertions-audio-1.txt", "assertions", &[Flag(false)]),
    // A single per-process entry: coreaudiod holds the display.
    (
        "pmset-assertions-audio-display-1.txt",
        "assertions",
        &[Flag(true)],
    ),
    // Chrome playing audio holds only system sleep.
    (
        "pmset-assertions-browser-1.txt",
        "assertions",
        &[Flag(false)],
    ),
    // `caffeinate -d`: the summary counts it.
    (
        "pmset-assertions-caffeinate-1.txt",
        "assertions",
        &[Flag(true)],
    ),
    // powerd's `InternalPreventDisplaySleep` is no app.
    (
        "pmset-assertions-hackintosh-1.txt",
        "assertions",
        &[Flag(false)],
    ),
    // Re-indented by Markdown, continuation TABs turned into spaces.
    (
        "pmset-assertions-kernel-1.txt",
        "assertions",
        &[Flag(false)],
    ),
    ("pmset-assertions-video-1.txt", "assertions", &[Flag(true)]),
    // No warning level recorded and CPU limits at 100: no pressure.
    ("pmset-therm-normal-1.txt", "thermal", &[Flag(false)]),
    ("pmset-therm-normal-2.txt", "thermal", &[Flag(false)]),
    ("pmset-therm-normal-3.txt", "thermal", &[Flag(false)]),
    ("pmset-therm-normal-4.txt", "thermal", &[Flag(false)]),
    ("pmset-therm-normal-5.txt", "thermal", &[Flag(false)]),
    ("pmset-therm-error-1.txt", "thermal", &[Unknown]),
    // `lowpowermode 0`, or `powermode 0` (automatic) with High Power Mode.
    ("pmset-g-1.txt", "low-power", &[Flag(false)]),
    ("pmset-g-2.txt", "low-power", &[Flag(false)]),
    ("pmset-g-3.txt", "low-power", &[Flag(false)]),
    ("pmset-g-4.txt", "low-power", &[Flag(false)]),
    ("pmset-g-custom-1.txt", "low-power", &[Flag(false)]),
    // A Mac mini has neither setting.
    ("pmset-g-desktop-1.txt", "low-power", &[Unknown]),
];

/// The folder of captures.
fn folder() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/macos")
}

/// A capture's tool text: the file less its `# source:` line.
fn body(file: &str) -> String {
    let path = folder().join(file);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => panic!("{}: {e}", path.display()),
    };
    match text.split_once('\n') {
        Some((first, rest)) if first.starts_with("# source: ") => rest.to_owned(),
        _ => panic!("{file}: the first line must be `# source: …`"),
    }
}

/// The capture's parts: apart at `--` lines, or one a line when `n` parts
/// are wanted and there is no `--`.
fn parts(body: &str, n: usize) -> Vec<String> {
    if body.lines().any(|l| l == "--") {
        let mut parts = vec![String::new()];
        for l in body.lines() {
            if l == "--" {
                parts.push(String::new());
            } else if let Some(last) = parts.last_mut() {
                last.push_str(l);
                last.push('\n');
            }
        }
        parts
    } else if n > 1 {
        body.lines().map(|l| format!("{l}\n")).collect()
    } else {
        vec![body.to_owned()]
    }
}

/// What `source`'s reader gives for `text`.
fn read(source: &str, text: &str) -> Want {
    let num = |v: Option<f64>| v.map_or(Unknown, Num);
    let flag = |v: Option<bool>| v.map_or(Unknown, Flag);
    match source {
        "hid-idle" => num(macos::parse_hid_idle(text)),
        "gpu-util" => num(macos::parse_gpu_util(text)),
        "power" => flag(macos::parse_on_battery(text)),
        "assertions" => flag(macos::parse_display_held(text)),
        "thermal" => flag(macos::parse_too_hot(text)),
        "screen-lock" => flag(macos::parse_screen_locked(text)),
        "low-power" => flag(macos::parse_low_power(text)),
        _ => panic!("no reader {source:?}"),
    }
}

fn same(got: Want, want: Want) -> bool {
    match (got, want) {
        (Num(g), Num(w)) => (g - w).abs() <= 1e-9 * w.abs().max(1.0),
        _ => got == want,
    }
}

#[test]
fn every_capture_gives_what_it_shows() {
    let mut wrong = Vec::new();
    for &(file, source, wants) in CAPTURES {
        let body = body(file);
        let parts = parts(&body, wants.len());
        assert_eq!(parts.len(), wants.len(), "{file}: parts");
        for (i, (part, &want)) in parts.iter().zip(wants).enumerate() {
            let got = read(source, part);
            if !same(got, want) {
                wrong.push(format!(
                    "{file} part {}: {source} gave {got:?}, wants {want:?}",
                    i + 1
                ));
            }
            // The worker's own path: an observation, or where the reader
            // cannot say an error, which the controller ignores.
            if macos::observe(source, part).is_some() != (want != Unknown) {
                wrong.push(format!(
                    "{file} part {}: observe({source}) disagrees with its reader",
                    i + 1
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn every_capture_has_a_row() {
    let entries = match std::fs::read_dir(folder()) {
        Ok(e) => e,
        Err(e) => panic!("{}: {e}", folder().display()),
    };
    let mut files: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name != "README.md")
        .collect();
    files.sort();
    let mut rows: Vec<String> = CAPTURES.iter().map(|r| r.0.to_owned()).collect();
    rows.sort();
    let n = rows.len();
    rows.dedup();
    assert_eq!(rows.len(), n, "a capture has two rows");
    assert_eq!(files, rows, "captures and rows differ");
    assert_eq!(files.len(), 55);
}

#[test]
fn a_desktop_mac_lends() {
    // A Mac mini: mains power, no low-power setting (unknown), idle input.
    let mut o = Observation {
        input_idle_secs: Some(600.0),
        ..Default::default()
    };
    for (file, source) in [
        ("pmset-batt-desktop-1.txt", "power"),
        ("pmset-g-desktop-1.txt", "low-power"),
    ] {
        if let Some(x) = macos::observe(source, &body(file)) {
            o.merge(x);
        }
    }
    assert_eq!(o.on_battery, Some(false));
    assert_eq!(o.low_power, None);
    assert_eq!(Policy::default().check(&o), Ok(()));
}
