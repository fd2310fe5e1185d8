//! Which done shards get a second run. The choice is a keyed hash of the
//! job and shard under a secret the watchdogs share and the workers never
//! see: it is the same on every watchdog (so two of them check a shard once,
//! or not at all), and a worker cannot tell which of its shards will be
//! checked, even after the fact for shards it has not yet run.

use sha2::{Digest, Sha256};

/// Whether `shard` of `job` is checked at `rate` (a fraction in [0, 1];
/// values outside it are clamped) under `key`.
pub fn picked(key: &[u8], job: &str, shard: u32, rate: f64) -> bool {
    if rate.is_nan() || rate <= 0.0 {
        return false;
    }
    if rate >= 1.0 {
        return true;
    }
    let h = Sha256::new()
        .chain_update((key.len() as u64).to_le_bytes())
        .chain_update(key)
        .chain_update(job.as_bytes())
        .chain_update([0])
        .chain_update(shard.to_le_bytes())
        .finalize();
    let mut n = [0u8; 8];
    n.copy_from_slice(&h[..8]);
    // The top 53 bits as a uniform fraction in [0, 1).
    let u = (u64::from_le_bytes(n) >> 11) as f64 / (1u64 << 53) as f64;
    u < rate
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn about_the_rate_is_picked_and_the_choice_is_stable() {
        let n = (0..20_000)
            .filter(|&s| picked(b"secret", "job", s, 0.05))
            .count();
        assert!((800..=1200).contains(&n), "{n} of 20000 at 5 %");
        let a: Vec<u32> = (0..2000).filter(|&s| picked(b"k", "j", s, 0.1)).collect();
        let b: Vec<u32> = (0..2000).filter(|&s| picked(b"k", "j", s, 0.1)).collect();
        assert_eq!(a, b);
    }

    #[test]
    fn another_key_picks_other_shards() {
        let a: Vec<u32> = (0..2000).filter(|&s| picked(b"k1", "j", s, 0.1)).collect();
        let b: Vec<u32> = (0..2000).filter(|&s| picked(b"k2", "j", s, 0.1)).collect();
        let common = a.iter().filter(|s| b.contains(s)).count();
        assert!(common < a.len() / 3, "{common} of {} in common", a.len());
    }

    #[test]
    fn the_rate_is_clamped() {
        assert!(!picked(b"k", "j", 1, 0.0));
        assert!(!picked(b"k", "j", 1, -1.0));
        assert!(!picked(b"k", "j", 1, f64::NAN));
        assert!(picked(b"k", "j", 1, 1.0));
        assert!(picked(b"k", "j", 1, 7.0));
    }
}
