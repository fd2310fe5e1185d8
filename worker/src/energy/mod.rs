//! Energy: what each shard delivery used, and the machine's power for the
//! heartbeat.
//!
//! A worker reads one meter, chosen once at start ([`describe`] tells which): NVIDIA's
//! `nvidia-smi` for a `cuda:N` device, Linux RAPL package counters, macOS
//! `powermetrics` when running as root, and otherwise an estimate from the
//! device kind ([`estimate`], `--power-watts`). The [`EnergyMeter`] samples
//! it about once a second and splits each interval's energy evenly between
//! the deliveries in flight ([`Ledger`]); a delivery's share goes on its
//! `done`, `failed` or `handed_back` event, and the machine's power and
//! total on each heartbeat.
//!
//! Layout, one concept a file:
//! - `source`: where figures come from ([`Source`]).
//! - `rapl`, `nvidia`, `powermetrics`, `estimate`: the meters, each a
//!   cumulative counter in joules.
//! - `track`: a sampled meter's counter between its samples.
//! - `ledger`: the even split between deliveries.
//! - `choose`: which meter, and why (also for `doctor`).
//! - `sampler`: the task and the API the worker calls.
//! - `bounded`: other programs' output, read with bounds.
//! - `error`: why a meter cannot be read.

mod bounded;
mod choose;
mod error;
pub mod estimate;
mod ledger;
mod nvidia;
mod powermetrics;
mod rapl;
mod sampler;
mod source;
mod track;

pub(crate) use bounded::command_output;
pub use choose::{Choice, PassedOver, describe};
pub use error::EnergyError;
pub use estimate::{Estimate, PowerModel};
pub use ledger::{Ledger, Share};
pub use nvidia::{GpuLine, NvidiaSmi, cuda_ordinal, parse_line as parse_nvidia_smi_line};
pub use powermetrics::{Parser as PowermetricsParser, PowerSample, Powermetrics};
pub use rapl::{POWERCAP_ROOT, Rapl};
pub use sampler::{DeliveryKey, EnergyMeter, NVIDIA_EVERY, SAMPLE_EVERY};
pub use source::Source;
pub use track::{Reading, Track};
