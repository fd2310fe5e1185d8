//! Models: the [`Model`] trait the queue code runs, the families that
//! implement it, and the per-worker cache that fetches, verifies and keeps
//! them warm.
//!
//! A new family (images, generation, speech) adds a file here, a variant to
//! [`minions_schemas::messages::ModelFamily`] and an arm in [`load`]; the
//! pull loop and settlement code do not change.

mod bert;
mod cache;
mod device;
mod encoder;
mod error;
mod kernels;
pub mod tiny;

use std::path::Path;
use std::sync::Arc;

use minions_schemas::messages::{ModelFamily, OutputPayload};

pub use bert::BertEmbedder;
pub use cache::ModelCache;
pub use device::{DeviceChoice, describe_device, select_device};
pub use error::ModelError;
pub use minions_schemas::messages::Precision;

/// A loaded model that turns a shard's texts into its output.
///
/// Implementations must be deterministic for the same inputs on the same
/// device (so a redelivered shard writes the same bytes), must return rows in
/// input order, and must not depend on how the texts are batched beyond
/// floating-point rounding.
pub trait Model: Send + Sync {
    /// The family this model belongs to.
    fn family(&self) -> ModelFamily;

    /// Runs the model over `texts` with at most `max_batch` texts per
    /// forward pass. Blocking and compute-heavy: call it off the async runtime.
    fn run(&self, texts: &[String], max_batch: usize) -> Result<OutputPayload, ModelError>;
}

/// Loads a verified model folder of `family` onto `device` in `precision`.
pub fn load(
    family: ModelFamily,
    dir: &Path,
    device: &candle_core::Device,
    precision: Precision,
) -> Result<Arc<dyn Model>, ModelError> {
    match family {
        ModelFamily::BertEmbedding => Ok(Arc::new(BertEmbedder::load(dir, device, precision)?)),
    }
}
