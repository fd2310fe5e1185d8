//! Models as the worker sees them: the engine's families and trait
//! (re-exported from `minions-engine`), and the per-worker cache that
//! fetches model folders from the store, verifies them and keeps them warm.

mod cache;

pub use cache::ModelCache;
pub use minions_engine::*;
