//! The `minions` command line: submit jobs, follow them, collect outputs,
//! push models, run a local fleet.
//!
//! Layout:
//! - [`cli`] — flags and subcommands.
//! - [`commands`] — one file per subcommand.
//! - [`input`] — where a job's records come from (JSON Lines, Parquet, memory).
//! - [`jsonl`] — the streaming, bounded JSONL reader.
//! - [`local_postgres`] — a throwaway local PostgreSQL server (dev, tests).
//! - [`parquet_input`] — Parquet files read by row groups.
//! - [`parquet_output`] — a finished job written as one Parquet file.
//! - [`prompts`] — generation records (prompts, chat messages, OpenAI batch lines).
//! - [`progress`] — a job's progress folded from its events.
//! - [`npy`] — the `.npy` writer.
//! - [`store_io`] — bounded document reads from the store.

pub mod cli;
pub mod commands;
pub mod input;
pub mod jsonl;
#[cfg(unix)]
pub mod local_postgres;
pub mod npy;
pub mod parquet_input;
pub mod parquet_output;
pub mod progress;
pub mod prompts;
pub mod speech_input;
pub mod store_io;
