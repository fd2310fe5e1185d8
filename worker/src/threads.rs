//! The compute thread count, fixed once per process.
//!
//! candle's CPU backend asks for its thread count on every matrix product
//! and, unless `RAYON_NUM_THREADS` is set, counts physical cores again each
//! time; on Linux machines where it finds no preferred-CPU set that means
//! reading `/proc/cpuinfo` per product. A profile of a worker running many
//! small shards put 12% of its time there. Setting the variable from inside
//! the process would need `unsafe` (other threads may read the environment
//! at the same moment), so a worker started without it runs itself again,
//! once, with it set to the count candle would have chosen.

/// The variable candle (and rayon) read for the thread count.
pub const THREADS_VAR: &str = "RAYON_NUM_THREADS";

/// Re-executes this program with [`THREADS_VAR`] set when it is unset (Unix;
/// same arguments, same process id). Returns when the variable is already
/// set, on other systems, or when the re-execution could not start (the
/// worker then runs with candle's per-call count).
pub fn fix_thread_count() {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        if std::env::var_os(THREADS_VAR).is_some() {
            return;
        }
        let Ok(exe) = std::env::current_exe() else {
            return;
        };
        let n = candle_core::utils::get_num_threads();
        // exec only returns on failure.
        let _failed = std::process::Command::new(exe)
            .args(std::env::args_os().skip(1))
            .env(THREADS_VAR, n.to_string())
            .exec();
    }
}
