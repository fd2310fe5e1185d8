//! The watchdog's web side: a live dashboard, a job's "why is it waiting"
//! page, JSON for scripts, `/metrics` for Prometheus, `/healthz`, and with
//! a usage ledger `/usage` and `/api/usage`.
//!
//! - [`server`] — routes and serving.
//! - [`access`] — who may read and act: tokens, sign-in, a trusted proxy.
//! - [`tls`] — HTTPS from a certificate and key.
//! - [`pages`] — HTML.
//! - [`metrics`] — the Prometheus text format.
//! - [`usage`] — reading the usage ledger for `/usage`.

pub mod access;
pub mod metrics;
pub mod pages;
pub mod server;
pub mod tls;
pub mod usage;

pub use access::HttpAccess;
pub use server::{Backends, HttpError, serve};
