//! Owner first: the machine's owner comes before the fleet. Signals say what
//! the owner is doing, a policy says when the GPU may be lent, and the
//! controller yields within one sample period when it may not: it stops
//! pulling, hands running shards back at once and releases GPU memory. After
//! a yield it lends again only once the conditions have held for a while, so
//! a flapping signal causes one hand-back, not many.

#[cfg(test)]
mod captures;
pub(crate) mod controller;
pub mod macos;
pub mod policy;
pub mod signal;

pub use policy::{Change, Gate, Policy};
pub use signal::{Observation, Source};
