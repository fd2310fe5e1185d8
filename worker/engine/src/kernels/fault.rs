//! A fault switch for tests of the canary: with
//! `MINIONS_TEST_KERNEL_FAULT=1` the linear-layer kernels of the embedding
//! family give wrong answers (each row's first output shifted by 1), as a
//! miscompiled kernel path or a bad CPU would. Off unless a test sets it;
//! read once per process.

use std::sync::OnceLock;

/// The environment variable that turns the switch on (`1`).
pub const KERNEL_FAULT_ENV: &str = "MINIONS_TEST_KERNEL_FAULT";

/// Whether this process's kernels are made wrong on purpose.
pub fn kernel_fault() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var(KERNEL_FAULT_ENV).is_ok_and(|v| v.trim() == "1"))
}

/// Makes a kernel's output of rows of `n` wrong, when the switch is on.
pub(super) fn apply(out: &mut [f32], n: usize) {
    if n == 0 || !kernel_fault() {
        return;
    }
    for row in out.chunks_mut(n) {
        row[0] += 1.0;
    }
}
