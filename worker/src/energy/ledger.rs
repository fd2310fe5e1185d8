//! Splitting a machine's energy between the deliveries running on it.
//!
//! The ledger is told the meter's cumulative counter at every sample and
//! whenever a delivery begins or ends. The energy since the previous
//! counter goes in equal parts to the deliveries open during that interval;
//! since every begin and end reads the counter, the set of open deliveries
//! never changes inside an interval, and a delivery shorter than one sample
//! still gets its part of the time it ran. Energy while nothing runs goes to
//! no delivery (it still counts in the machine's total).

use std::collections::HashMap;
use std::hash::Hash;

/// What a delivery has been given so far.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Share {
    /// Joules.
    pub joules: f64,
    /// False once any of it came from an estimate.
    pub measured: bool,
}

/// The machine's energy and each open delivery's share of it.
#[derive(Debug)]
pub struct Ledger<K> {
    /// The counter at the last [`Ledger::advance`]; `None` before the first.
    last: Option<f64>,
    open: HashMap<K, Share>,
    total: f64,
}

impl<K: Eq + Hash> Default for Ledger<K> {
    fn default() -> Self {
        Self {
            last: None,
            open: HashMap::new(),
            total: 0.0,
        }
    }
}

impl<K: Eq + Hash> Ledger<K> {
    /// An empty ledger that has seen no counter yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the meter's counter (joules, cumulative): the energy since the
    /// last one is added to the total and split evenly between the open
    /// deliveries, each marked estimated unless `measured`. Returns that
    /// energy. The first counter only sets the start; one that goes back
    /// (or is not finite) counts nothing and, if finite, becomes the new
    /// start.
    pub fn advance(&mut self, counter: f64, measured: bool) -> f64 {
        if !counter.is_finite() {
            return 0.0;
        }
        let delta = match self.last {
            Some(last) if counter >= last => counter - last,
            _ => 0.0,
        };
        self.last = Some(counter);
        self.total += delta;
        if !self.open.is_empty() {
            let each = delta / self.open.len() as f64;
            for share in self.open.values_mut() {
                share.joules += each;
                share.measured &= measured;
            }
        }
        delta
    }

    /// Sets the counter's start without counting anything (another meter
    /// takes over).
    pub fn rebase(&mut self, counter: f64) {
        if counter.is_finite() {
            self.last = Some(counter);
        }
    }

    /// Whether a counter has been seen, so that shares mean something.
    pub fn started(&self) -> bool {
        self.last.is_some()
    }

    /// Opens a delivery's share (the counter must have been advanced to
    /// now first, or it shares what came before). Opening one that is open
    /// keeps its share.
    pub fn open(&mut self, key: K) {
        self.open.entry(key).or_insert(Share {
            joules: 0.0,
            measured: true,
        });
    }

    /// Closes a delivery's share and returns it (advance the counter to now
    /// first); `None` when it was not open.
    pub fn close(&mut self, key: &K) -> Option<Share> {
        self.open.remove(key)
    }

    /// Whether any delivery is open.
    pub fn busy(&self) -> bool {
        !self.open.is_empty()
    }

    /// The energy counted since the first counter, joules.
    pub fn total(&self) -> f64 {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(l: &mut Ledger<&'static str>, k: &'static str) -> f64 {
        l.close(&k).map_or(f64::NAN, |s| s.joules)
    }

    #[test]
    fn overlapping_deliveries_split_each_interval_evenly() {
        let mut l = Ledger::new();
        l.advance(100.0, true); // start
        l.open("a");
        l.advance(110.0, true); // a alone: 10
        l.open("b");
        l.advance(130.0, true); // a and b: 10 each
        l.open("c");
        l.advance(160.0, true); // a, b, c: 10 each
        assert!((close(&mut l, "a") - 30.0).abs() < 1e-9);
        l.advance(180.0, true); // b, c: 10 each
        assert!((close(&mut l, "b") - 30.0).abs() < 1e-9);
        l.advance(185.0, true); // c alone: 5
        assert!((close(&mut l, "c") - 25.0).abs() < 1e-9);
        // Idle energy goes to nobody but counts in the total.
        l.advance(200.0, true);
        assert!((l.total() - 100.0).abs() < 1e-9);
        assert!(!l.busy());
        assert_eq!(l.close(&"a"), None);
    }

    #[test]
    fn shares_add_up_to_the_busy_energy() {
        let mut l = Ledger::new();
        l.advance(0.0, true);
        let keys = ["a", "b", "c", "d"];
        let mut given = 0.0;
        let mut counter = 0.0;
        for (i, k) in keys.iter().enumerate() {
            l.open(*k);
            counter += 7.0 * (i as f64 + 1.0);
            l.advance(counter, true);
        }
        for k in keys {
            counter += 3.0;
            l.advance(counter, true);
            given += close(&mut l, k);
        }
        assert!((given - counter).abs() < 1e-9, "{given} vs {counter}");
    }

    #[test]
    fn first_counter_starts_and_backward_counts_nothing() {
        let mut l = Ledger::new();
        assert!(!l.started());
        l.open("a");
        assert_eq!(l.advance(1000.0, true), 0.0);
        assert!(l.started());
        assert_eq!(l.advance(990.0, true), 0.0);
        assert_eq!(l.advance(f64::NAN, true), 0.0);
        assert_eq!(l.advance(995.0, true), 5.0);
        assert_eq!(l.close(&"a").map(|s| s.joules), Some(5.0));
    }

    #[test]
    fn an_estimated_interval_marks_the_share() {
        let mut l = Ledger::new();
        l.advance(0.0, true);
        l.open("a");
        l.advance(5.0, true);
        l.rebase(0.0); // the estimate takes over
        l.open("b");
        l.advance(2.0, false);
        assert_eq!(
            l.close(&"a"),
            Some(Share {
                joules: 6.0,
                measured: false
            })
        );
        l.advance(3.0, true);
        assert_eq!(
            l.close(&"b"),
            Some(Share {
                joules: 2.0,
                measured: false
            })
        );
    }
}
