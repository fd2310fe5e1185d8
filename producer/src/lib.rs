//! The `minions` command line: submit jobs, follow them, collect outputs,
//! push models, run a local fleet.
//!
//! Layout:
//! - [`cli`] — flags and subcommands.
//! - [`commands`] — one file per subcommand.
//! - [`jsonl`] — the streaming, bounded JSONL reader.
//! - [`prompts`] — generation records (prompts, chat messages, OpenAI batch lines).
//! - [`progress`] — a job's progress folded from its events.
//! - [`npy`] — the `.npy` writer.
//! - [`publish`] — publishing shard tasks and CLI-side events.
//! - [`store_io`] — bounded document reads from the store.

pub mod cli;
pub mod commands;
pub mod jsonl;
pub mod npy;
pub mod progress;
pub mod prompts;
pub mod publish;
pub mod store_io;
