//! macOS owner signals, read from the system's own tools:
//! - `hid-idle`: `ioreg -r -d 1 -w 0 -c IOHIDSystem` — `"HIDIdleTime" = <ns>`
//!   since the last keyboard or mouse input;
//! - `gpu-util`: `ioreg -r -d 1 -w 0 -c IOAccelerator` — `"Device Utilization
//!   %"` (AMD: `"GPU Activity(%)"`) inside each accelerator's
//!   `PerformanceStatistics`;
//! - `power`: `pmset -g batt` — the `Now drawing from '…'` line names the
//!   source (`'AC Power'`, `'Battery Power'`, or `'UPS Power'` when a UPS
//!   carries the machine through a mains outage);
//! - `assertions`: `pmset -g assertions` — `PreventUserIdleDisplaySleep 1`
//!   in the system-wide summary, or without a summary a process's
//!   `PreventUserIdleDisplaySleep named: "…"` entry, while an app keeps the
//!   display awake (video playback, calls);
//! - `thermal`: `pmset -g therm` — a `CPU_Speed_Limit` or
//!   `CPU_Scheduler_Limit` below 100, or a non-zero thermal or performance
//!   warning level, means thermal pressure;
//! - `screen-lock`: `ioreg -n Root -d 1 -w 0` — `"IOConsoleLocked" = Yes`,
//!   or `"CGSSessionScreenIsLocked"=Yes` in the session on the console,
//!   while the screen is locked (the owner is away whatever the input idle
//!   time says);
//! - `low-power`: `pmset -g` — `lowpowermode 1`, or on Macs with High Power
//!   Mode `powermode 1` (0 automatic, 1 low power, 2 high power), while
//!   low-power mode is on.
//!
//! `ioreg` prints a node's own properties as `"key" = value`, one a line,
//! and the entries of nested dictionaries as `"key"=value`, with no spaces
//! and all on that line; `-w 0` keeps it from clipping long lines to the
//! terminal's width. The parsers take the tools' text so they can be tested
//! anywhere.

use super::signal::Observation;

/// The whole number at the start of `text`, if any.
fn leading_number(text: &str) -> Option<f64> {
    let digits: String = text.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// The values of a node's own property `key` in ioreg's text, one per line
/// that carries it (`"key" = value`; a nested `"key"=value` never matches).
fn ioreg_properties<'a>(text: &'a str, key: &str) -> impl Iterator<Item = &'a str> {
    let quoted = format!("\"{key}\" = ");
    text.lines()
        .filter_map(move |l| l.find(&quoted).map(|at| l[at + quoted.len()..].trim_end()))
}

/// The number of `"key"=number` inside an ioreg dictionary printed on one
/// line (`{"a"=1,"key"=37}`); the quotes keep `"key (more)"` apart.
fn ioreg_dict_number(dict: &str, key: &str) -> Option<f64> {
    let quoted = format!("\"{key}\"=");
    let at = dict.find(&quoted)?;
    leading_number(&dict[at + quoted.len()..])
}

/// The outermost `{…}` dictionaries in an ioreg value such as an array of
/// dictionaries (`({…},{…})`), skipping braces inside quoted strings.
fn ioreg_dicts(value: &str) -> Vec<&str> {
    let mut dicts = Vec::new();
    let (mut depth, mut start, mut quoted) = (0usize, 0usize, false);
    for (i, c) in value.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '{' if !quoted => {
                if depth == 0 {
                    start = i;
                }
                depth += 1;
            }
            '}' if !quoted && depth > 0 => {
                depth -= 1;
                if depth == 0 {
                    dicts.push(&value[start..=i]);
                }
            }
            _ => {}
        }
    }
    dicts
}

/// Seconds since the last input, from `ioreg -r -d 1 -c IOHIDSystem`: the
/// node's own `"HIDIdleTime" = <ns>` (the least, should there be two nodes).
pub fn parse_hid_idle(text: &str) -> Option<f64> {
    ioreg_properties(text, "HIDIdleTime")
        .filter_map(leading_number)
        .fold(None, |least: Option<f64>, ns| {
            Some(least.map_or(ns, |l| l.min(ns)))
        })
        .map(|ns| ns / 1e9)
}

/// The busiest accelerator's utilisation, from `ioreg -r -d 1 -c IOAccelerator`.
///
/// Only each node's own `"PerformanceStatistics" = {…}` line counts: AMD
/// drivers also print a `"Device Utilization %"` inside
/// `PerformanceStatisticsAccum`, which is not a percentage of now. Apple
/// Silicon and Intel GPUs give `"Device Utilization %"`; AMD ones may give
/// only `"GPU Activity(%)"`. Intel GPUs have been seen above 100, so the
/// value is capped there.
pub fn parse_gpu_util(text: &str) -> Option<f64> {
    ioreg_properties(text, "PerformanceStatistics")
        .filter_map(|stats| {
            ioreg_dict_number(stats, "Device Utilization %")
                .or_else(|| ioreg_dict_number(stats, "GPU Activity(%)"))
        })
        .map(|v| v.min(100.0))
        .fold(None, |best: Option<f64>, v| {
            Some(best.map_or(v, |b| b.max(v)))
        })
}

/// Whether the machine draws from a battery, from `pmset -g batt`.
///
/// The source line is usually the first, but `pmset` may print a notice
/// (`* Battery Polling is Stopped`) before it, and old releases said
/// `Currently drawing from`. `'UPS Power'` means the mains is out and a UPS
/// battery carries the machine, so it counts as battery.
pub fn parse_on_battery(text: &str) -> Option<bool> {
    text.lines().find_map(|l| {
        let (_, rest) = l.split_once("drawing from '")?;
        let (source, _) = rest.split_once('\'')?;
        match source {
            "Battery Power" | "UPS Power" => Some(true),
            "AC Power" => Some(false),
            _ => None,
        }
    })
}

/// Assertion types that keep the display awake, as `pmset` lists them per
/// process: apps that still use the old name pass `NoDisplaySleepAssertion`
/// and `pmset` shows it as given (as it shows `NoIdleSleepAssertion`).
const DISPLAY_ASSERTIONS: [&str; 2] = ["PreventUserIdleDisplaySleep", "NoDisplaySleepAssertion"];

/// The assertion type of one per-process entry of `pmset -g assertions`
/// (`pid 917(zoom.us): [0x00031ac200019f04] 00:41:09
/// PreventUserIdleDisplaySleep named: "zoom.us meeting"`): the word before
/// ` named:`.
fn assertion_type(line: &str) -> Option<&str> {
    let (head, _) = line.split_once(" named:")?;
    head.split_whitespace().last()
}

/// Whether an app keeps the display awake, from `pmset -g assertions`.
///
/// The system-wide summary (`   PreventUserIdleDisplaySleep    1`) decides
/// when it is there. Without it (output cut before it, or an excerpt of the
/// per-process list) the entries listed by owning process decide: held if
/// one is `PreventUserIdleDisplaySleep` (or the old name
/// `NoDisplaySleepAssertion`), not held if none is; neither summary nor
/// entries is unknown. `InternalPreventDisplaySleep` is powerd delaying the
/// display's turning off after input
/// (`com.apple.powermanagement.delayDisplayOff`), not an app, and does not
/// count. Words are split on any whitespace, so text re-indented on its way
/// (pasted into Markdown, say) reads the same.
pub fn parse_display_held(text: &str) -> Option<bool> {
    let (mut summary, mut listed) = (None, None);
    for l in text.lines() {
        let mut words = l.split_whitespace();
        match words.next() {
            Some("PreventUserIdleDisplaySleep") if summary.is_none() => {
                summary = words
                    .next()
                    .and_then(|n| n.parse::<u32>().ok())
                    .map(|n| n > 0);
            }
            Some("pid") => {
                if let Some(kind) = assertion_type(l) {
                    let display = DISPLAY_ASSERTIONS.contains(&kind);
                    listed = Some(listed == Some(true) || display);
                }
            }
            _ => {}
        }
    }
    summary.or(listed)
}

/// Whether the machine is thermally throttled, from `pmset -g therm`.
///
/// `pmset` prints, each on its own: the thermal warning level
/// (`<date> Thermal Warning Level = N`, 0 normal, 255 unknown) or `Note: No
/// thermal warning level has been recorded`; the same for the performance
/// warning level; and the CPU power status (`<date> CPU Power notify`, then
/// tab-indented `CPU_Scheduler_Limit \t= 100`, `CPU_Available_CPUs`,
/// `CPU_Speed_Limit`) or `Note: No CPU power status has been recorded`. Any
/// limit below 100 or warning level other than 0 and 255 is thermal pressure.
pub fn parse_too_hot(text: &str) -> Option<bool> {
    let (mut known, mut hot) = (false, false);
    for l in text.lines() {
        let l = l.trim();
        if l.starts_with("Note: No ") && l.ends_with("has been recorded") {
            known = true;
            continue;
        }
        let Some((key, value)) = l.split_once('=') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<u32>() else {
            continue;
        };
        let key = key.trim();
        if key == "CPU_Speed_Limit" || key == "CPU_Scheduler_Limit" {
            known = true;
            hot |= value < 100;
        } else if key.ends_with("Thermal Warning Level")
            || key.ends_with("Performance Warning Level")
        {
            known = true;
            hot |= value != 0 && value != 255;
        }
    }
    known.then_some(hot)
}

/// Whether the console's screen is locked, from `ioreg -n Root -d 1`.
///
/// The kernel keeps `"IOConsoleLocked" = Yes` on the root while the screen
/// is locked, at the login window and on the way to sleep. The session on
/// the console (`"kCGSSessionOnConsoleKey"=Yes` in `IOConsoleUsers`)
/// carries `"CGSSessionScreenIsLocked"=Yes` while locked and lacks the key
/// while unlocked; other (fast-user-switched) sessions may carry it too and
/// are ignored. No session on the console means nobody is logged in there.
pub fn parse_screen_locked(text: &str) -> Option<bool> {
    let flag = ioreg_properties(text, "IOConsoleLocked")
        .next()
        .map(|v| v == "Yes");
    let console = ioreg_properties(text, "IOConsoleUsers")
        .next()
        .map(|users| {
            ioreg_dicts(users)
                .into_iter()
                .find(|s| s.contains("\"kCGSSessionOnConsoleKey\"=Yes"))
        });
    match (flag, console) {
        (Some(true), _) => Some(true),
        (_, Some(Some(session))) => Some(session.contains("\"CGSSessionScreenIsLocked\"=Yes")),
        (Some(false), _) => Some(false),
        (None, Some(None)) => Some(true),
        (None, None) => None,
    }
}

/// Whether low-power mode is on, from `pmset -g`.
///
/// Under `Currently in use:` `pmset` prints one setting a line, its name and
/// its value apart by spaces (` lowpowermode         1`). Macs with only Low
/// Power Mode say `lowpowermode` (0 off, 1 on); Macs that also have High
/// Power Mode say `powermode` (0 automatic, 1 low power, 2 high power).
/// Either one set to low power is enough; neither present means unknown
/// (a Mac without the setting, or an older macOS).
pub fn parse_low_power(text: &str) -> Option<bool> {
    let setting = |name: &str| {
        text.lines().find_map(|l| {
            let mut words = l.split_whitespace();
            if words.next()? != name {
                return None;
            }
            words.next()?.parse::<u32>().ok()
        })
    };
    let low = setting("lowpowermode").map(|v| v != 0);
    let mode = setting("powermode").map(|v| v == 1);
    match (low, mode) {
        (None, None) => None,
        (low, mode) => Some(low == Some(true) || mode == Some(true)),
    }
}

/// What one macOS source reports.
pub fn observe(source: &str, text: &str) -> Option<Observation> {
    let mut o = Observation::default();
    match source {
        "hid-idle" => o.input_idle_secs = Some(parse_hid_idle(text)?),
        "gpu-util" => o.gpu_busy_pct = Some(parse_gpu_util(text)?),
        "power" => o.on_battery = Some(parse_on_battery(text)?),
        "assertions" => o.display_held = Some(parse_display_held(text)?),
        "thermal" => o.too_hot = Some(parse_too_hot(text)?),
        "screen-lock" => o.screen_locked = Some(parse_screen_locked(text)?),
        "low-power" => o.low_power = Some(parse_low_power(text)?),
        _ => return None,
    }
    Some(o)
}

/// The tool and arguments behind each macOS source.
///
/// `-r -d 1` prints only the matching nodes with their properties, not the
/// registry from its root down to them (IOHIDSystem sits four levels deep,
/// under hundreds of other nodes); `-w 0` turns off clipping.
pub fn command(source: &str) -> Option<(&'static str, &'static [&'static str])> {
    Some(match source {
        "hid-idle" => ("ioreg", &["-r", "-d", "1", "-w", "0", "-c", "IOHIDSystem"]),
        "gpu-util" => (
            "ioreg",
            &["-r", "-d", "1", "-w", "0", "-c", "IOAccelerator"],
        ),
        "power" => ("pmset", &["-g", "batt"]),
        "assertions" => ("pmset", &["-g", "assertions"]),
        "thermal" => ("pmset", &["-g", "therm"]),
        "screen-lock" => ("ioreg", &["-n", "Root", "-d", "1", "-w", "0"]),
        "low-power" => ("pmset", &["-g"]),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Samples written in the tools' documented formats; output captured on
    // real Macs is checked in `captures.rs`.

    #[test]
    fn hid_idle() {
        let t = "  | |   \"HIDIdleTime\" = 12500000000\n  | |   \"HIDParameters\" = {}\n";
        assert_eq!(parse_hid_idle(t), Some(12.5));
        assert_eq!(parse_hid_idle("nothing here"), None);
    }

    #[test]
    fn gpu_util_takes_the_busiest() {
        let t = "\"PerformanceStatistics\" = {\"In use system memory\"=1,\"Device Utilization %\"=7}\n\
                 \"PerformanceStatistics\" = {\"Device Utilization %\"=63,\"Renderer Utilization %\"=60}\n";
        assert_eq!(parse_gpu_util(t), Some(63.0));
    }

    #[test]
    fn power_source() {
        assert_eq!(
            parse_on_battery("Now drawing from 'Battery Power'\n -InternalBattery-0\t80%"),
            Some(true)
        );
        assert_eq!(
            parse_on_battery("Now drawing from 'AC Power'\n"),
            Some(false)
        );
        assert_eq!(parse_on_battery(""), None);
    }

    #[test]
    fn screen_lock() {
        let locked = "+-o Root  <class IORegistryEntry>\n    \"IOConsoleUsers\" = ({\"kCGSSessionOnConsoleKey\"=Yes,\"kCGSSessionUserNameKey\"=\"ann\",\"CGSSessionScreenIsLocked\"=Yes})\n";
        assert_eq!(parse_screen_locked(locked), Some(true));
        assert_eq!(
            parse_screen_locked(&locked.replace(",\"CGSSessionScreenIsLocked\"=Yes", "")),
            Some(false)
        );
        assert_eq!(parse_screen_locked("nothing"), None);
    }

    #[test]
    fn display_assertions_and_thermal() {
        let a = "Assertion status system-wide:\n   PreventUserIdleDisplaySleep    1\n   PreventSystemSleep             0\n";
        assert_eq!(parse_display_held(a), Some(true));
        assert_eq!(
            parse_display_held(&a.replace("Sleep    1", "Sleep    0")),
            Some(false)
        );
        assert_eq!(
            parse_too_hot(
                "CPU_Scheduler_Limit \t= 100\nCPU_Available_CPUs \t= 8\nCPU_Speed_Limit \t= 70\n"
            ),
            Some(true)
        );
        assert_eq!(
            parse_too_hot("Note: No thermal warning level has been recorded\n"),
            Some(false)
        );
    }

    // The samples below follow the layout of real output (ioreg's and
    // pmset's printing code, and captures quoted in public issue threads),
    // with made-up values.

    #[test]
    fn hid_idle_from_the_matched_node_alone() {
        let t = "+-o IOHIDSystem  <class IOHIDSystem, id 0x100000a31, registered, matched, active, busy 0 (4 ms), retain 22>\n\
                 \x20   {\n\
                 \x20     \"IOClass\" = \"IOHIDSystem\"\n\
                 \x20     \"HIDScrollCountBootDefault\" = {\"HIDScrollCountMinDeltaToStart\"=30,\"HIDScrollCountMax\"=2000}\n\
                 \x20     \"IOProviderClass\" = \"IOResources\"\n\
                 \x20     \"HIDIdleTime\" = 73250000000\n\
                 \x20     \"CursorState\" = {\"LastMoveCursor (Seconds ago)\"=\"73.250410\"}\n\
                 \x20   }\n\
                 \x20   \n";
        assert_eq!(parse_hid_idle(t), Some(73.25));
        // A nested entry of the same name is not the node's own.
        assert_eq!(
            parse_hid_idle("      \"HIDParameters\" = {\"HIDIdleTime\"=5}\n"),
            None
        );
    }

    #[test]
    fn gpu_util_on_apple_silicon() {
        let t = "+-o AGXAcceleratorG14X  <class AGXAcceleratorG14X, id 0x100000b2c, registered, matched, active, busy 0 (21 ms), retain 27>\n\
                 \x20   {\n\
                 \x20     \"IOClass\" = \"AGXAcceleratorG14X\"\n\
                 \x20     \"AGCInfo\" = {\"fLastSubmissionPID\"=611,\"fSubmissionsSinceLastCheck\"=2,\"fBusyCount\"=0}\n\
                 \x20     \"PerformanceStatistics\" = {\"TiledSceneBytes\"=2359296,\"Alloc system memory\"=1073741824,\"Tiler Utilization %\"=8,\"recoveryCount\"=0,\"Renderer Utilization %\"=9,\"SplitSceneCount\"=0,\"Allocated PB Size\"=18874368,\"Device Utilization %\"=23,\"In use system memory\"=402653184}\n\
                 \x20     \"gpu-core-count\" = 10\n\
                 \x20   }\n\
                 \x20   \n";
        assert_eq!(parse_gpu_util(t), Some(23.0));
        assert_eq!(
            parse_gpu_util(&t.replace("\"Device Utilization %\"=23,", "")),
            None
        );
    }

    #[test]
    fn gpu_util_on_an_intel_mac_with_an_amd_gpu() {
        // The running totals in PerformanceStatisticsAccum are not read; the
        // AMD GPU reports only "GPU Activity(%)" here, and the look-alike
        // "Device Utilization % at cur p-state" is another key.
        let t = "+-o IntelAccelerator  <class IntelAccelerator, id 0x100000417, registered, matched, active, busy 0 (9 ms), retain 98>\n\
                 \x20   {\n\
                 \x20     \"PerformanceStatisticsAccum\" = {\"textureCount\"=2210,\"Device Utilization %\"=88,\"surfaceCount\"=31}\n\
                 \x20     \"PerformanceStatistics\" = {\"Device Unit 0 Utilization %\"=12,\"Device Utilization %\"=12,\"inUseVidMemoryBytes\"=0}\n\
                 \x20   }\n\
                 \x20   \n\
                 +-o AMDRadeonX6000_AMDNavi14GraphicsAccelerator  <class AMDRadeonX6000_AMDNavi14GraphicsAccelerator, id 0x100000466, registered, matched, active, busy 0 (240 ms), retain 121>\n\
                 \x20   {\n\
                 \x20     \"PerformanceStatisticsAccum\" = {\"Device Utilization %\"=95,\"context2DCount\"=3}\n\
                 \x20     \"PerformanceStatistics\" = {\"Temperature(C)\"=58,\"Device Utilization % at cur p-state\"=77,\"GPU Activity(%)\"=35,\"Fan Speed(%)\"=27}\n\
                 \x20   }\n\
                 \x20   \n";
        assert_eq!(parse_gpu_util(t), Some(35.0));
        // Intel GPUs can report more than 100.
        assert_eq!(
            parse_gpu_util("      \"PerformanceStatistics\" = {\"Device Utilization %\"=137}\n"),
            Some(100.0)
        );
    }

    #[test]
    fn power_source_in_pmset_batt() {
        let laptop_ac = "Now drawing from 'AC Power'\n -InternalBattery-0 (id=9318403)\t96%; AC attached; not charging present: true\n";
        assert_eq!(parse_on_battery(laptop_ac), Some(false));
        let polling_note = "* Battery Polling is Stopped\nNow drawing from 'Battery Power'\n -InternalBattery-0 (id=9318403)\t61%; discharging; 3:07 remaining present: true\n";
        assert_eq!(parse_on_battery(polling_note), Some(true));
        let outage = "Now drawing from 'UPS Power'\n -Back-UPS XS 1000M (id=1234)\t88%; discharging; 0:37 remaining present: true\n";
        assert_eq!(parse_on_battery(outage), Some(true));
        assert_eq!(
            parse_on_battery("Currently drawing from 'AC Power'\n"),
            Some(false)
        );
        assert_eq!(parse_on_battery("No power source info available\n"), None);
    }

    #[test]
    fn display_held_in_pmset_assertions() {
        let t = "2025-03-14 09:26:53 +0100 \n\
                 Assertion status system-wide:\n\
                 \x20  BackgroundTask                 0\n\
                 \x20  ApplePushServiceTask           0\n\
                 \x20  UserIsActive                   1\n\
                 \x20  PreventUserIdleDisplaySleep    1\n\
                 \x20  PreventSystemSleep             0\n\
                 \x20  ExternalMedia                  0\n\
                 \x20  PreventUserIdleSystemSleep     1\n\
                 \x20  NetworkClientActive            0\n\
                 Listed by owning process:\n\
                 \x20  pid 917(zoom.us): [0x00031ac200019f04] 00:41:09 PreventUserIdleDisplaySleep named: \"zoom.us meeting\"  \n\
                 \x20  pid 917(zoom.us): [0x00031ac200019f05] 00:41:09 PreventUserIdleSystemSleep named: \"zoom.us meeting\"  \n\
                 \x20  pid 133(hidd): [0x00031d7e00099a12] 00:00:03 UserIsActive named: \"com.apple.iohideventsystem.queue.tickle\"  \n\
                 \tTimeout will fire in 1197 secs Action=TimeoutActionRelease\n";
        assert_eq!(parse_display_held(t), Some(true));
        let idle = t.replace(
            "PreventUserIdleDisplaySleep    1",
            "PreventUserIdleDisplaySleep    0",
        );
        assert_eq!(parse_display_held(&idle), Some(false));
        assert_eq!(parse_display_held("No assertions.\n"), None);
    }

    #[test]
    fn display_held_without_the_summary() {
        // The per-process entries decide when the summary is missing.
        let listed = "Listed by owning process:\n\
                      \x20  pid 617(WindowServer): [0x000acb3f0009844e] 00:00:00 UserIsActive named: \"tickle\"\n\
                      \x20  pid 79(Player): [0x000a953c0005a19a] 00:01:54 PreventUserIdleDisplaySleep named: \"Playing\"\n";
        assert_eq!(parse_display_held(listed), Some(true));
        let legacy = listed.replace("PreventUserIdleDisplaySleep", "NoDisplaySleepAssertion");
        assert_eq!(parse_display_held(&legacy), Some(true));
        let system_only =
            listed.replace("PreventUserIdleDisplaySleep", "PreventUserIdleSystemSleep");
        assert_eq!(parse_display_held(&system_only), Some(false));
        // powerd's delay before the display turns off is no app.
        let powerd = listed.replace(
            "PreventUserIdleDisplaySleep named: \"Playing\"",
            "InternalPreventDisplaySleep named: \"com.apple.powermanagement.delayDisplayOff\"",
        );
        assert_eq!(parse_display_held(&powerd), Some(false));
        // The summary, when there, wins over the entries.
        let summary =
            format!("Assertion status system-wide:\n   PreventUserIdleDisplaySleep    0\n{listed}");
        assert_eq!(parse_display_held(&summary), Some(false));
    }

    #[test]
    fn thermal_in_pmset_therm() {
        let throttled = "2024-07-02 15:40:11 +0200 Thermal Warning Level = 0\n\
                         Note: No performance warning level has been recorded\n\
                         2024-07-02 15:40:11 +0200 CPU Power notify\n\
                         \tCPU_Scheduler_Limit \t= 100\n\
                         \tCPU_Available_CPUs \t= 8\n\
                         \tCPU_Speed_Limit \t= 64\n";
        assert_eq!(parse_too_hot(throttled), Some(true));
        let nominal = "Note: No thermal warning level has been recorded\n\
                       Note: No performance warning level has been recorded\n\
                       2025-01-20 11:02:47 -0500 CPU Power notify\n\
                       \tCPU_Scheduler_Limit \t= 100\n\
                       \tCPU_Available_CPUs \t= 10\n\
                       \tCPU_Speed_Limit \t= 100\n";
        assert_eq!(parse_too_hot(nominal), Some(false));
        let nothing = "Note: No thermal warning level has been recorded\n\
                       Note: No performance warning level has been recorded\n\
                       Note: No CPU power status has been recorded\n";
        assert_eq!(parse_too_hot(nothing), Some(false));
        // A warning level with no CPU power status.
        let warned = "2025-06-11 14:12:05 +0900 Thermal Warning Level = 100\n\
                      Note: No performance warning level has been recorded\n\
                      Note: No CPU power status has been recorded\n";
        assert_eq!(parse_too_hot(warned), Some(true));
        let scheduler = nominal.replace("Scheduler_Limit \t= 100", "Scheduler_Limit \t= 40");
        assert_eq!(parse_too_hot(&scheduler), Some(true));
        assert_eq!(
            parse_too_hot("Error:Failed to get thermal warning level with error code 0xe00002c7\n"),
            None
        );
    }

    #[test]
    fn screen_lock_reads_the_console_session() {
        let unlocked = "+-o Root  <class IORegistryEntry, id 0x100000100, retain 38>\n\
                        \x20   {\n\
                        \x20     \"IOKitBuildVersion\" = \"Darwin Kernel Version 23.6.0\"\n\
                        \x20     \"IOConsoleLocked\" = No\n\
                        \x20     \"IOConsoleUsers\" = ({\"kCGSSessionOnConsoleKey\"=Yes,\"kSCSecuritySessionID\"=100018,\"kCGSSessionSystemSafeBoot\"=No,\"kCGSessionLoginDoneKey\"=Yes,\"kCGSSessionIDKey\"=257,\"kCGSSessionUserNameKey\"=\"ann\",\"kCGSSessionGroupIDKey\"=20,\"kCGSSessionUserIDKey\"=502})\n\
                        \x20     \"IORegistryPlanes\" = {\"IOService\"=\"IOService\",\"IOPower\"=\"IOPower\"}\n\
                        \x20   }\n\
                        \x20   \n";
        assert_eq!(parse_screen_locked(unlocked), Some(false));
        let locked = unlocked
            .replace("\"IOConsoleLocked\" = No", "\"IOConsoleLocked\" = Yes")
            .replace(
                "\"kCGSSessionGroupIDKey\"=20,",
                "\"kCGSSessionGroupIDKey\"=20,\"CGSSessionScreenLockedTime\"=1741942013,\"CGSSessionScreenIsLocked\"=Yes,",
            );
        assert_eq!(parse_screen_locked(&locked), Some(true));
        // Either signal alone is enough.
        let flag_only = unlocked.replace("\"IOConsoleLocked\" = No", "\"IOConsoleLocked\" = Yes");
        assert_eq!(parse_screen_locked(&flag_only), Some(true));
        let session_only = locked.replace("\"IOConsoleLocked\" = Yes", "\"IOConsoleLocked\" = No");
        assert_eq!(parse_screen_locked(&session_only), Some(true));
        // A fast-user-switched session in the background may be locked while
        // the one on the console is in use.
        let switched = unlocked.replace(
            "\"kCGSSessionUserIDKey\"=502})",
            "\"kCGSSessionUserIDKey\"=502},{\"kCGSSessionOnConsoleKey\"=No,\"kCGSSessionIDKey\"=259,\"kCGSSessionUserNameKey\"=\"bob\",\"CGSSessionScreenIsLocked\"=Yes,\"kCGSSessionUserIDKey\"=503})",
        );
        assert_eq!(parse_screen_locked(&switched), Some(false));
        // At the login window nobody's session is on the console.
        let login_window =
            "    {\n      \"IOConsoleLocked\" = Yes\n      \"IOConsoleUsers\" = ()\n    }\n";
        assert_eq!(parse_screen_locked(login_window), Some(true));
    }

    #[test]
    fn low_power_in_pmset_g() {
        let t = "System-wide power settings:\n\
                 Currently in use:\n\
                 \x20standby              1\n\
                 \x20Sleep On Power Button 1\n\
                 \x20hibernatefile        /var/vm/sleepimage\n\
                 \x20powernap             1\n\
                 \x20networkoversleep     0\n\
                 \x20disksleep            10\n\
                 \x20sleep                1 (sleep prevented by powerd, coreaudiod)\n\
                 \x20hibernatemode        3\n\
                 \x20ttyskeepawake        1\n\
                 \x20displaysleep         2\n\
                 \x20tcpkeepalive         1\n\
                 \x20lowpowermode         1\n\
                 \x20womp                 0\n";
        assert_eq!(parse_low_power(t), Some(true));
        let off = t.replace("lowpowermode         1", "lowpowermode         0");
        assert_eq!(parse_low_power(&off), Some(false));
        // Macs with High Power Mode: 0 automatic, 1 low power, 2 high power.
        let mode = |v: &str| {
            t.replace(
                "lowpowermode         1",
                &format!("powermode            {v}"),
            )
        };
        assert_eq!(parse_low_power(&mode("1")), Some(true));
        assert_eq!(parse_low_power(&mode("0")), Some(false));
        assert_eq!(parse_low_power(&mode("2")), Some(false));
        // Either key saying low power is enough.
        let both = off.replace(" womp", " powermode            1\n womp");
        assert_eq!(parse_low_power(&both), Some(true));
        // Neither key: a Mac or macOS without the setting.
        let absent = t.replace(" lowpowermode         1\n", "");
        assert_eq!(parse_low_power(&absent), None);
        assert_eq!(parse_low_power(" lowpowermode         on\n"), None);
        assert_eq!(parse_low_power(""), None);
        assert_eq!(
            observe("low-power", t).map(|o| o.low_power),
            Some(Some(true))
        );
        assert_eq!(command("low-power"), Some(("pmset", &["-g"][..])));
    }
}
