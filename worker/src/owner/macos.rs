//! macOS owner signals, read from the system's own tools:
//! - `hid-idle`: `ioreg -c IOHIDSystem` — `"HIDIdleTime" = <ns>` since the
//!   last keyboard or mouse input;
//! - `gpu-util`: `ioreg -r -d 1 -c IOAccelerator` — `"Device Utilization %"`
//!   inside each accelerator's `PerformanceStatistics`;
//! - `power`: `pmset -g batt` — its first line names the source drawing
//!   power (`'AC Power'` or `'Battery Power'`);
//! - `assertions`: `pmset -g assertions` — `PreventUserIdleDisplaySleep 1`
//!   while an app keeps the display awake (video playback, calls);
//! - `thermal`: `pmset -g therm` — a `CPU_Speed_Limit` below 100 means
//!   thermal pressure;
//! - `screen-lock`: `ioreg -n Root -d 1` — `"CGSSessionScreenIsLocked"=Yes`
//!   in the console user's session while the screen is locked (the owner is
//!   away whatever the input idle time says).
//!
//! The parsers take the tools' text so they can be tested anywhere.

use super::signal::Observation;

/// The first `"key" = number` on any line of `text` (ioreg's format).
fn ioreg_number(text: &str, key: &str) -> Option<f64> {
    let quoted = format!("\"{key}\"");
    text.lines().find_map(|l| {
        let at = l.find(&quoted)?;
        let rest = l[at + quoted.len()..].trim_start().strip_prefix('=')?;
        let digits: String = rest
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        digits.parse().ok()
    })
}

/// Seconds since the last input, from `ioreg -c IOHIDSystem`.
pub fn parse_hid_idle(text: &str) -> Option<f64> {
    ioreg_number(text, "HIDIdleTime").map(|ns| ns / 1e9)
}

/// The busiest accelerator's utilisation, from `ioreg -r -d 1 -c IOAccelerator`
/// (the statistics dictionary is printed inline: `"Device Utilization %"=37`).
pub fn parse_gpu_util(text: &str) -> Option<f64> {
    let key = "\"Device Utilization %\"=";
    let mut best: Option<f64> = None;
    for (i, _) in text.match_indices(key) {
        let digits: String = text[i + key.len()..]
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        if let Ok(v) = digits.parse::<f64>() {
            best = Some(best.map_or(v, |b| b.max(v)));
        }
    }
    best
}

/// Whether the machine draws from its battery, from `pmset -g batt`.
pub fn parse_on_battery(text: &str) -> Option<bool> {
    let first = text.lines().next()?;
    if first.contains("'Battery Power'") {
        Some(true)
    } else if first.contains("'AC Power'") || first.contains("'UPS Power'") {
        Some(false)
    } else {
        None
    }
}

/// Whether an app keeps the display awake, from `pmset -g assertions`.
pub fn parse_display_held(text: &str) -> Option<bool> {
    text.lines().find_map(|l| {
        let mut words = l.split_whitespace();
        (words.next()? == "PreventUserIdleDisplaySleep").then(|| words.next() == Some("1"))
    })
}

/// Whether the machine is thermally throttled, from `pmset -g therm`.
pub fn parse_too_hot(text: &str) -> Option<bool> {
    for l in text.lines() {
        if let Some((k, v)) = l.split_once('=')
            && k.trim() == "CPU_Speed_Limit"
        {
            return v.trim().parse::<u32>().ok().map(|limit| limit < 100);
        }
    }
    if text.contains("No thermal warning level has been recorded") {
        return Some(false);
    }
    None
}

/// Whether the console session's screen is locked, from `ioreg -n Root -d 1`
/// (the key is absent while unlocked).
pub fn parse_screen_locked(text: &str) -> Option<bool> {
    if !text.contains("IOConsoleUsers") {
        return None;
    }
    Some(text.contains("\"CGSSessionScreenIsLocked\"=Yes"))
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
        _ => return None,
    }
    Some(o)
}

/// The tool and arguments behind each macOS source.
pub fn command(source: &str) -> Option<(&'static str, &'static [&'static str])> {
    Some(match source {
        "hid-idle" => ("ioreg", &["-c", "IOHIDSystem", "-d", "4"]),
        "gpu-util" => ("ioreg", &["-r", "-d", "1", "-c", "IOAccelerator"]),
        "power" => ("pmset", &["-g", "batt"]),
        "assertions" => ("pmset", &["-g", "assertions"]),
        "thermal" => ("pmset", &["-g", "therm"]),
        "screen-lock" => ("ioreg", &["-n", "Root", "-d", "1"]),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Samples written in the tools' documented formats; fixtures captured on
    // a Mac belong beside them.

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
        let locked = "+-o Root  <class IORegistryEntry>\n    \"IOConsoleUsers\" = ({\"kCGSSessionUserNameKey\"=\"ann\",\"CGSSessionScreenIsLocked\"=Yes})\n";
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
}
