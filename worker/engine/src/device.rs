use candle_core::Device;

/// Which compute device a worker asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
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
