//! The integration tests, one binary: each module is one area of the
//! product driven through the real binaries against real servers (nats-server,
//! moto, PostgreSQL, headless Chromium). One binary rather than one per file:
//! each link pulled in the whole workspace, and the test command spent
//! minutes linking. Run one area with `cargo nextest run -p minions-tests
//! -E 'test(/^cluster::/)'` (or `cargo test -p minions-tests --test
//! integration cluster::`).

mod admin;
mod bad_input;
mod canary;
mod chaos;
mod cluster;
mod core_path;
mod dashboard;
mod deploy_configs;
mod dev_fleet;
mod device_path;
mod doctor;
mod failover;
mod first_hour;
mod fuzz_decoders;
mod fuzz_jsonl;
mod gpu_script;
mod leaf;
mod ledger;
mod llm_fleet;
mod llm_reference;
mod llm_stages;
mod nats_restart;
mod old_server;
mod operations;
mod owner;
mod parquet_io;
mod pause;
mod poison;
mod real_model;
mod roles;
mod s3_store;
mod sharing;
mod speech_fleet;
mod speech_reference;
mod tls;
mod trust;
mod verify;
mod watchdog_checkpoint;
mod watchdog_restart;
