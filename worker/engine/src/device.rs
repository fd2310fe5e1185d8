use candle_core::Device;

/// Which compute device a worker asks for (`--device`: the names in
/// [`DeviceChoice::CHOICES`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// Metal on macOS builds with the `metal` feature, CUDA on builds with
    /// the `cuda` feature when a GPU is present, else the CPU.
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// Apple GPU through Metal (needs the `metal` feature).
    Metal,
    /// NVIDIA GPU through CUDA (needs the `cuda` feature).
    Cuda,
}

impl DeviceChoice {
    /// Each choice's name and what it means, in the order `--help` lists
    /// them.
    pub const CHOICES: [(&str, &str); 4] = [
        (
            "auto",
            "Metal on macOS builds with the `metal` feature, CUDA on builds with the `cuda` feature when a GPU is present, else the CPU",
        ),
        ("cpu", "The CPU"),
        (
            "metal",
            "Apple GPU through Metal (needs the `metal` feature)",
        ),
        ("cuda", "NVIDIA GPU through CUDA (needs the `cuda` feature)"),
    ];
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "metal" => Ok(Self::Metal),
            "cuda" => Ok(Self::Cuda),
            _ => Err(format!(
                "unknown device {s:?} (one of auto, cpu, metal, cuda)"
            )),
        }
    }
}

impl std::fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = match self {
            Self::Auto => 0,
            Self::Cpu => 1,
            Self::Metal => 2,
            Self::Cuda => 3,
        };
        f.write_str(Self::CHOICES[i].0)
    }
}

/// Opens the device for `choice`; an explicit GPU choice that this build or
/// machine cannot serve is an error, `auto` falls back to the CPU.
pub fn select_device(choice: DeviceChoice) -> Result<Device, candle_core::Error> {
    match choice {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Metal => Device::new_metal(0),
        DeviceChoice::Cuda => Device::new_cuda(0),
        DeviceChoice::Auto => {
            if cfg!(feature = "metal")
                && let Ok(d) = Device::new_metal(0)
            {
                return Ok(d);
            }
            if cfg!(feature = "cuda")
                && let Ok(d) = Device::new_cuda(0)
            {
                return Ok(d);
            }
            Ok(Device::Cpu)
        }
    }
}

/// A short name for a device, as heartbeats and logs show it.
pub fn describe_device(device: &Device) -> String {
    match device {
        Device::Cpu => "cpu".to_owned(),
        Device::Cuda(_) => "cuda:0".to_owned(),
        Device::Metal(_) => "metal:0".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() -> Result<(), String> {
        for (name, _) in DeviceChoice::CHOICES {
            assert_eq!(name.parse::<DeviceChoice>()?.to_string(), name);
        }
        assert!("gpu".parse::<DeviceChoice>().is_err());
        Ok(())
    }
}
