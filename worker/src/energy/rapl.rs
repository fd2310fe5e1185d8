//! Linux RAPL: the CPU packages' energy counters under
//! `/sys/class/powercap`.
//!
//! Each top-level domain `intel-rapl:N` is one package (socket); its
//! subdomains `intel-rapl:N:M` (core, uncore, dram) are parts of it and are
//! not added again. AMD Zen exposes the same `intel-rapl` interface. A
//! top-level domain named `psys` (the whole platform, on some laptops)
//! overlaps the packages and is left out: only domains whose `name` starts
//! with `package` count (a domain without a `name` file counts).
//!
//! `energy_uj` counts microjoules and wraps to 0 after
//! `max_energy_range_uj`; a reading below the previous one is a wrap. Since
//! Linux 5.10 `energy_uj` is readable by root only (a side channel fix):
//! other users get [`EnergyError::RaplPermission`] and the worker falls back
//! to another meter. A udev rule or `chmod a+r` on the files lets a non-root
//! worker read them.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::error::EnergyError;

/// Where Linux exposes powercap domains.
pub const POWERCAP_ROOT: &str = "/sys/class/powercap";

/// The most bytes read from one sysfs file (they hold one number).
const MAX_FILE_BYTES: u64 = 64;

/// One package domain's counter.
#[derive(Debug)]
struct Domain {
    /// Its `energy_uj` file.
    energy: PathBuf,
    /// Its `max_energy_range_uj`: the counter wraps to 0 after it.
    max_range_uj: u64,
    /// The last raw reading, µJ.
    last_uj: u64,
}

/// The sum of a machine's RAPL package counters, as one cumulative counter
/// in joules that starts at 0 when opened and never goes back (wraps are
/// undone per domain).
#[derive(Debug)]
pub struct Rapl {
    root: PathBuf,
    domains: Vec<Domain>,
    joules: f64,
}

impl Rapl {
    /// Finds the package domains under `root` (normally [`POWERCAP_ROOT`])
    /// and reads each counter once, so that an unreadable counter shows now.
    pub fn open(root: &Path) -> Result<Self, EnergyError> {
        let dirs = package_domains(root)?;
        if dirs.is_empty() {
            return Err(EnergyError::RaplAbsent {
                root: root.to_owned(),
            });
        }
        let mut domains = Vec::with_capacity(dirs.len());
        for dir in dirs {
            let max_path = dir.join("max_energy_range_uj");
            let max_range_uj = read_u64(&max_path)?;
            if max_range_uj == 0 {
                return Err(EnergyError::parse("max_energy_range_uj", "0"));
            }
            let energy = dir.join("energy_uj");
            let last_uj = read_u64(&energy)?;
            domains.push(Domain {
                energy,
                max_range_uj,
                last_uj,
            });
        }
        Ok(Self {
            root: root.to_owned(),
            domains,
            joules: 0.0,
        })
    }

    /// How many package domains are summed.
    pub fn domains(&self) -> usize {
        self.domains.len()
    }

    /// The powercap folder read.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Reads every counter and returns the energy since [`Rapl::open`],
    /// joules. On an error nothing is counted, and the next successful read
    /// counts everything since the last one (the counters are cumulative).
    pub fn read(&mut self) -> Result<f64, EnergyError> {
        let mut now = Vec::with_capacity(self.domains.len());
        for d in &self.domains {
            now.push(read_u64(&d.energy)?);
        }
        let mut delta_uj: u64 = 0;
        for (d, uj) in self.domains.iter_mut().zip(now) {
            delta_uj = delta_uj.saturating_add(wrapped_delta(d.last_uj, uj, d.max_range_uj));
            d.last_uj = uj;
        }
        self.joules += delta_uj as f64 / 1e6;
        Ok(self.joules)
    }
}

/// The energy between two raw readings of a counter that wraps to 0 after
/// `max_range`: `now - last`, or across a wrap `max_range - last + now`.
pub(crate) fn wrapped_delta(last: u64, now: u64, max_range: u64) -> u64 {
    if now >= last {
        now - last
    } else {
        max_range.saturating_sub(last).saturating_add(now)
    }
}

/// Whether a powercap entry is a top-level RAPL domain: `intel-rapl:N`,
/// not a subdomain `intel-rapl:N:M`, nor `intel-rapl-mmio:N` (the same
/// package again through MMIO), nor the `intel-rapl` control type itself.
pub(crate) fn is_top_level(name: &str) -> bool {
    name.strip_prefix("intel-rapl:")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The package domains' folders under `root`, in name order.
fn package_domains(root: &Path) -> Result<Vec<PathBuf>, EnergyError> {
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(EnergyError::RaplAbsent {
                root: root.to_owned(),
            });
        }
        Err(e) => {
            return Err(EnergyError::Io {
                path: root.to_owned(),
                source: e,
            });
        }
    };
    let mut dirs: Vec<PathBuf> = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !is_top_level(name) {
            continue;
        }
        let dir = entry.path();
        match read_small(&dir.join("name")) {
            Ok(n) if !n.trim().starts_with("package") => continue,
            _ => dirs.push(dir),
        }
    }
    dirs.sort();
    Ok(dirs)
}

/// The error for a file that could not be read: a refusal is
/// [`EnergyError::RaplPermission`], which says how to allow it.
fn io_error(path: &Path, e: std::io::Error) -> EnergyError {
    if e.kind() == std::io::ErrorKind::PermissionDenied {
        EnergyError::RaplPermission {
            path: path.to_owned(),
        }
    } else {
        EnergyError::Io {
            path: path.to_owned(),
            source: e,
        }
    }
}

/// A small sysfs file's text.
fn read_small(path: &Path) -> Result<String, EnergyError> {
    let io = |e: std::io::Error| io_error(path, e);
    let mut text = String::new();
    std::fs::File::open(path)
        .map_err(io)?
        .take(MAX_FILE_BYTES)
        .read_to_string(&mut text)
        .map_err(io)?;
    Ok(text)
}

/// A sysfs file holding one unsigned number.
fn read_u64(path: &Path) -> Result<u64, EnergyError> {
    let text = read_small(path)?;
    text.trim()
        .parse::<u64>()
        .map_err(|_| EnergyError::parse("RAPL counter", &text))
}

#[cfg(test)]
mod tests {
    use super::*;

    type Res = Result<(), Box<dyn std::error::Error>>;

    /// Writes a fake powercap domain.
    fn domain(root: &Path, dir: &str, name: &str, uj: u64, max: u64) -> std::io::Result<()> {
        let d = root.join(dir);
        std::fs::create_dir_all(&d)?;
        std::fs::write(d.join("name"), format!("{name}\n"))?;
        std::fs::write(d.join("energy_uj"), format!("{uj}\n"))?;
        std::fs::write(d.join("max_energy_range_uj"), format!("{max}\n"))?;
        Ok(())
    }

    fn set(root: &Path, dir: &str, uj: u64) -> std::io::Result<()> {
        std::fs::write(root.join(dir).join("energy_uj"), format!("{uj}\n"))
    }

    #[test]
    fn top_level_names() {
        assert!(is_top_level("intel-rapl:0"));
        assert!(is_top_level("intel-rapl:12"));
        assert!(!is_top_level("intel-rapl:0:1"));
        assert!(!is_top_level("intel-rapl"));
        assert!(!is_top_level("intel-rapl:"));
        assert!(!is_top_level("intel-rapl-mmio:0"));
        assert!(!is_top_level("dtpm"));
    }

    #[test]
    fn sums_package_domains_only() -> Res {
        let tmp = tempfile::tempdir()?;
        let root = tmp.path();
        domain(
            root,
            "intel-rapl:0",
            "package-0",
            1_000_000,
            262_143_328_850,
        )?;
        domain(
            root,
            "intel-rapl:1",
            "package-1",
            5_000_000,
            262_143_328_850,
        )?;
        // Parts of package 0, the platform domain and the MMIO copy: not added.
        domain(root, "intel-rapl:0:0", "core", 0, 262_143_328_850)?;
        domain(root, "intel-rapl:0:1", "dram", 0, 262_143_328_850)?;
        domain(root, "intel-rapl:2", "psys", 0, 262_143_328_850)?;
        domain(root, "intel-rapl-mmio:0", "package-0", 0, 262_143_328_850)?;
        std::fs::create_dir_all(root.join("intel-rapl"))?;

        let mut rapl = Rapl::open(root)?;
        assert_eq!(rapl.domains(), 2);
        assert_eq!(rapl.read()?, 0.0);

        set(root, "intel-rapl:0", 3_500_000)?; // +2.5 J
        set(root, "intel-rapl:1", 6_000_000)?; // +1 J
        set(root, "intel-rapl:0:0", 9_000_000)?;
        set(root, "intel-rapl:2", 9_000_000)?;
        set(root, "intel-rapl-mmio:0", 9_000_000)?;
        assert!((rapl.read()? - 3.5).abs() < 1e-9);
        Ok(())
    }

    #[test]
    fn a_wrap_is_undone() -> Res {
        let tmp = tempfile::tempdir()?;
        let root = tmp.path();
        let max = 65_532_610_987;
        domain(root, "intel-rapl:0", "package-0", max - 1_000_000, max)?;
        let mut rapl = Rapl::open(root)?;
        // 1 J to the top, wrap, 2 J more.
        set(root, "intel-rapl:0", 2_000_000)?;
        assert!((rapl.read()? - 3.0).abs() < 1e-9);
        set(root, "intel-rapl:0", 2_500_000)?;
        assert!((rapl.read()? - 3.5).abs() < 1e-9);
        assert_eq!(wrapped_delta(10, 15, 100), 5);
        assert_eq!(wrapped_delta(90, 5, 100), 15);
        assert_eq!(wrapped_delta(7, 7, 100), 0);
        Ok(())
    }

    #[test]
    fn a_missing_folder_or_no_domain_is_absent() -> Res {
        let tmp = tempfile::tempdir()?;
        let e = Rapl::open(&tmp.path().join("powercap"));
        assert!(matches!(e, Err(EnergyError::RaplAbsent { .. })), "{e:?}");
        domain(tmp.path(), "intel-rapl:0:0", "core", 0, 100)?;
        let e = Rapl::open(tmp.path());
        assert!(matches!(e, Err(EnergyError::RaplAbsent { .. })), "{e:?}");
        Ok(())
    }

    #[test]
    fn garbage_in_a_counter_is_an_error() -> Res {
        let tmp = tempfile::tempdir()?;
        domain(tmp.path(), "intel-rapl:0", "package-0", 5, 100)?;
        let mut rapl = Rapl::open(tmp.path())?;
        std::fs::write(tmp.path().join("intel-rapl:0/energy_uj"), "-3\n")?;
        assert!(matches!(rapl.read(), Err(EnergyError::Parse { .. })));
        // A failed read counts nothing; the next one counts it all.
        set(tmp.path(), "intel-rapl:0", 2_000_005)?;
        assert!((rapl.read()? - 2.0).abs() < 1e-9);
        Ok(())
    }

    #[test]
    fn a_refusal_says_how_to_allow_it() {
        let path = Path::new("/sys/class/powercap/intel-rapl:0/energy_uj");
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let e = io_error(path, denied);
        assert!(matches!(e, EnergyError::RaplPermission { .. }), "{e:?}");
        let text = e.to_string();
        for word in ["intel-rapl:0/energy_uj", "5.10", "root", "udev", "chmod"] {
            assert!(text.contains(word), "{word}: {text}");
        }
        let other = io_error(path, std::io::Error::from(std::io::ErrorKind::NotFound));
        assert!(matches!(other, EnergyError::Io { .. }), "{other:?}");
    }

    /// Where the tests do not run as root, a real unreadable file.
    #[cfg(unix)]
    #[test]
    fn an_unreadable_counter_asks_for_permission() -> Res {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir()?;
        domain(tmp.path(), "intel-rapl:0", "package-0", 5, 100)?;
        let file = tmp.path().join("intel-rapl:0/energy_uj");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o200))?;
        if std::fs::read(&file).is_ok() {
            // Running as root: every file is readable; nothing to check.
            return Ok(());
        }
        let e = Rapl::open(tmp.path());
        match e {
            Err(e @ EnergyError::RaplPermission { .. }) => {
                let text = e.to_string();
                assert!(text.contains("root") && text.contains("udev"), "{text}");
            }
            other => panic!("{other:?}"),
        }
        Ok(())
    }
}
