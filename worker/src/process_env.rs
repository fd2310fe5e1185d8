//! Settings the worker's libraries read from the environment once, at
//! start, fixed before any work runs.
//!
//! - `RAYON_NUM_THREADS`: candle's CPU backend asks for its thread count on
//!   every matrix product and, unless this is set, counts physical cores
//!   again each time; on Linux machines where it finds no preferred-CPU set
//!   that means reading `/proc/cpuinfo` per product. A profile of a worker
//!   running many small shards put 12% of its time there. The worker sets
//!   it to the count candle would have chosen.
//! - `MIMALLOC_PURGE_DELAY`: the worker allocates through mimalloc, which by
//!   default hands freed pages back to the kernel soon after (10 ms in
//!   mimalloc 2, 1 s in mimalloc 3, the one built here); every tensor op of
//!   the next batch then faults them in again (a profile of BERT inference
//!   under glibc's allocator put about 40% of the time in page faults; at
//!   10 ms the CPU embedding benchmark runs about 15% slower than at 10 s).
//!   The worker keeps freed memory for 10 s, so a running job reuses it and
//!   an idle worker still gives it back.
//!
//! Setting variables from inside the process would need `unsafe` (other
//! threads may read the environment at the same moment), so a worker
//! started without them runs itself again, once, with them set. A value the
//! user set is kept.

/// The variable candle (and rayon) read for the thread count.
pub const THREADS_VAR: &str = "RAYON_NUM_THREADS";

/// The variable mimalloc reads for how long freed memory is kept, ms.
pub const PURGE_DELAY_VAR: &str = "MIMALLOC_PURGE_DELAY";

/// How long freed memory is kept before it goes back to the kernel, ms.
pub const PURGE_DELAY_MS: u32 = 10_000;

/// Re-executes this program with [`THREADS_VAR`] and [`PURGE_DELAY_VAR`]
/// set when either is unset (Unix; same arguments, same process id).
/// Returns when both are set, on other systems, or when the re-execution
/// could not start (the worker then runs with the libraries' defaults).
pub fn fix_process_env() {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let threads = std::env::var_os(THREADS_VAR).is_none();
        let purge = std::env::var_os(PURGE_DELAY_VAR).is_none();
        if !threads && !purge {
            return;
        }
        let Ok(exe) = std::env::current_exe() else {
            return;
        };
        let mut cmd = std::process::Command::new(exe);
        cmd.args(std::env::args_os().skip(1));
        if threads {
            cmd.env(
                THREADS_VAR,
                candle_core::utils::get_num_threads().to_string(),
            );
        }
        if purge {
            cmd.env(PURGE_DELAY_VAR, PURGE_DELAY_MS.to_string());
        }
        // exec only returns on failure.
        let _failed = cmd.exec();
    }
}
