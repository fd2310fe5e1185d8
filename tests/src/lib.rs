//! The integration-test harness: real `nats-server` processes on free ports
//! with their own store dirs (killable, pausable, restartable), a real
//! S3-compatible server (moto) on loopback, a real PostgreSQL for the
//! ledger ([`PgServer`]), and the real Minions binaries.
//!
//! External tools are found through environment variables that
//! `tests/run.sh` sets (`NATS_SERVER_BIN`, `MINIONS_MOTO_BIN`,
//! `MINIONS_TEST_MODEL_DIR`, `MINIONS_TEST_GGUF`), falling back to the `.tools/` folder that
//! script fills, then to `PATH`.

pub mod bench;
mod certs;
mod cli;
pub mod cluster;
mod corpus;
mod error;
mod events;
mod fleet;
pub mod fuzz;
mod greedy;
mod locate;
mod models;
mod nats;
pub mod ports;
pub mod postgres;
mod processes;
mod s3;
mod scenarios;
mod scratch;
mod systemd;
mod vectors;
pub mod web;

pub use certs::write_test_certs;
pub use cli::{minions, minions_ok, minions_submit, push_tiny_model, submit_tiny_job, wait_done};
pub use corpus::write_corpus;
pub use error::{BoxError, Result};
pub use events::job_events;
pub use fleet::Fleet;
pub use greedy::{chat_prompts, chat_records, generate_all, greedy_cases};
pub use locate::{bin, tool, workspace_root};
pub use models::{
    CLEAR_CLIPS, SLOW, SLOW_PACE_MS, real_gguf, real_model_dir, real_whisper, speech_clips,
    tiny_model,
};
pub use nats::{NatsServer, role_password, role_passwords};
pub use ports::dashboard_url;
pub use postgres::PgServer;
pub use processes::{Proc, log_count, log_value};
pub use s3::{S3Server, Users};
pub use scenarios::{SlowShard, core_job_scenario};
pub use scratch::scratch;
pub use systemd::PrivateSystemd;
pub use vectors::{max_abs_diff, read_npy_f32};
