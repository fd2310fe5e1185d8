//! The watchdog's web side: a live dashboard, a job's "why is it waiting"
//! page, JSON for scripts, `/metrics` for Prometheus, `/healthz`, and with
//! a usage ledger `/usage` and `/api/usage`.
//!
//! - [`server`] — routes and serving.
//! - [`pages`] — HTML.
//! - [`metrics`] — the Prometheus text format.
//! - [`usage`] — reading the usage ledger for `/usage`.

pub mod metrics;
pub mod pages;
pub mod server;
pub mod usage;

pub use server::{Backends, HttpError, serve};
