//! The watchdog's web side: a live dashboard, a job's "why is it waiting"
//! page, JSON for scripts, `/metrics` for Prometheus and `/healthz`.
//!
//! - [`server`] — routes and serving.
//! - [`pages`] — HTML.
//! - [`metrics`] — the Prometheus text format.

pub mod metrics;
pub mod pages;
pub mod server;

pub use server::{HttpError, serve};
