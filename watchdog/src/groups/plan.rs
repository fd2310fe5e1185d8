//! Choosing a group's members and their layers: pure rules, no I/O.
//!
//! Layers go to members in proportion to the memory each lends (equally
//! when any lends an unknown amount), at least one each, so a machine
//! lending twice as much holds about twice the layers. A member holds its
//! share of the job's memory need (weights and what a pass holds besides,
//! as `submit` estimated it for the whole model); a group forms only when
//! every share fits its member.

use std::ops::Range;

use minions_schemas::WorkerId;
use minions_schemas::messages::GroupMember;

/// An idle worker that could join a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The worker.
    pub worker: WorkerId,
    /// Memory it lends, MB (0 = unknown, taken as enough).
    pub lend_mb: u64,
    /// Its device (`cpu`, `cuda:0`, …).
    pub device: String,
    /// Nanoseconds per layer per token it took as a stage (0: never
    /// measured).
    pub layer_ns: u32,
}

/// `layers` split over members lending `lends` MB, in order: each range
/// after the one before, none empty (when `layers >= lends.len()`);
/// weights that sum to `layers` give exactly those counts.
pub fn ranges(layers: u32, lends: &[u64]) -> Vec<Range<u32>> {
    let n = lends.len() as u32;
    if n == 0 {
        return Vec::new();
    }
    let weights: Vec<f64> = if lends.contains(&0) {
        vec![1.0; lends.len()]
    } else {
        lends.iter().map(|&l| l as f64).collect()
    };
    let total: f64 = weights.iter().sum();
    // Each its floor of the exact share (at least one), then the rest by
    // largest remainder; shares that sum to `layers` come out exact.
    let ideal: Vec<f64> = weights
        .iter()
        .map(|w| w / total * f64::from(layers))
        .collect();
    let mut counts: Vec<u32> = ideal.iter().map(|x| (x.floor() as u32).max(1)).collect();
    while counts.iter().sum::<u32>() > layers.max(n) {
        let Some(most) = (0..counts.len()).max_by_key(|&i| (counts[i], usize::MAX - i)) else {
            break;
        };
        counts[most] -= 1;
    }
    let mut left = layers.saturating_sub(counts.iter().sum());
    let mut order: Vec<usize> = (0..lends.len()).collect();
    order.sort_by(|&a, &b| {
        let (fa, fb) = (ideal[a] - ideal[a].floor(), ideal[b] - ideal[b].floor());
        fb.total_cmp(&fa).then(a.cmp(&b))
    });
    for &i in order.iter().cycle() {
        if left == 0 {
            break;
        }
        counts[i] += 1;
        left -= 1;
    }
    let mut out = Vec::with_capacity(counts.len());
    let mut at = 0;
    for c in counts {
        out.push(at..at + c);
        at += c;
    }
    out
}

/// MB a member holding `held` of `layers` layers needs, of `need_mb` for
/// the whole model.
pub fn share_mb(need_mb: u64, held: u32, layers: u32) -> u64 {
    (need_mb * u64::from(held)).div_ceil(u64::from(layers.max(1)))
}

/// Whether `c` can hold `held` of `layers` layers.
fn fits(c: &Candidate, need_mb: u64, held: u32, layers: u32) -> bool {
    c.lend_mb == 0 || c.lend_mb >= share_mb(need_mb, held, layers)
}

/// A new group of `stages` members from `idle`, those lending the most
/// first; or why none forms, in words a user reads ("no group of 2
/// workers lends 40000 MB"). `split` (empty, or one share per stage)
/// fixes each stage's share of the layers; the largest shares go to the
/// members lending the most.
pub fn form(
    stages: usize,
    layers: u32,
    need_mb: u64,
    idle: &[Candidate],
    split: &[u32],
) -> Result<Vec<GroupMember>, String> {
    if (layers as usize) < stages {
        return Err(format!(
            "the model's {layers} layers cannot be split {stages} ways"
        ));
    }
    let mut by_lend: Vec<&Candidate> = idle.iter().collect();
    by_lend.sort_by(|a, b| {
        let key = |c: &Candidate| if c.lend_mb == 0 { u64::MAX } else { c.lend_mb };
        key(b).cmp(&key(a)).then(a.worker.cmp(&b.worker))
    });
    if by_lend.len() < stages {
        return Err(format!(
            "waiting for a group: {} idle worker(s) of the {stages} it needs",
            by_lend.len()
        ));
    }
    let mut chosen = by_lend[..stages].to_vec();
    let lends: Vec<u64> = chosen.iter().map(|c| c.lend_mb).collect();
    let split = if split.len() == stages {
        let shares: Vec<u64> = split.iter().map(|&s| u64::from(s.max(1))).collect();
        let fixed = ranges(layers, &shares);
        // Stage positions by share, largest first, take the members by
        // lent memory, largest first.
        let mut places: Vec<usize> = (0..stages).collect();
        places.sort_by(|&a, &b| fixed[b].len().cmp(&fixed[a].len()).then(a.cmp(&b)));
        let mut placed = chosen.clone();
        for (c, &at) in chosen.iter().zip(&places) {
            placed[at] = c;
        }
        chosen = placed;
        fixed
    } else {
        by_speed(layers, need_mb, &chosen).unwrap_or_else(|| ranges(layers, &lends))
    };
    for (c, r) in chosen.iter().zip(&split) {
        if !fits(c, need_mb, r.len() as u32, layers) {
            return Err(format!(
                "no group of {stages} workers lends {need_mb} MB (the {stages} idle workers lending the most lend {} MB)",
                lends.iter().sum::<u64>()
            ));
        }
    }
    Ok(chosen
        .iter()
        .zip(split)
        .map(|(c, r)| GroupMember {
            worker: c.worker.clone(),
            first_layer: r.start,
            end_layer: r.end,
        })
        .collect())
}

/// Ranges in proportion to each member's measured speed, when every
/// member has one and every share fits what it lends; `None` otherwise
/// (the caller shares by lent memory).
fn by_speed(layers: u32, need_mb: u64, chosen: &[&Candidate]) -> Option<Vec<Range<u32>>> {
    if chosen.iter().any(|c| c.layer_ns == 0) {
        return None;
    }
    // Speeds scaled to whole numbers: the slowest member weighs 1000.
    let slowest = chosen.iter().map(|c| c.layer_ns).max()?;
    let speeds: Vec<u64> = chosen
        .iter()
        .map(|c| u64::from(slowest) * 1000 / u64::from(c.layer_ns).max(1))
        .collect();
    let r = ranges(layers, &speeds);
    chosen
        .iter()
        .zip(&r)
        .all(|(c, r)| fits(c, need_mb, r.len() as u32, layers))
        .then_some(r)
}

/// Most stages a group has.
pub const MOST_STAGES: usize = 4;

/// The smallest group (2 to [`MOST_STAGES`] members) from `idle` whose
/// shares of a model no one worker holds fit; or why none forms.
pub fn smallest(layers: u32, need_mb: u64, idle: &[Candidate]) -> Result<Vec<GroupMember>, String> {
    for n in 2..=MOST_STAGES.min(layers as usize) {
        if let Ok(m) = form(n, layers, need_mb, idle, &[]) {
            return Ok(m);
        }
    }
    let lent: u64 = {
        let mut l: Vec<u64> = idle.iter().map(|c| c.lend_mb).collect();
        l.sort_unstable_by(|a, b| b.cmp(a));
        l.iter().take(MOST_STAGES).sum()
    };
    Err(format!(
        "no worker lends the {need_mb} MB it needs, and no group of up to {MOST_STAGES} idle workers does ({} idle, lending {lent} MB together at most); it runs when workers that lend enough are idle",
        idle.len()
    ))
}

/// A worker from `idle` to take over `range` of a group: the one lending
/// the least that fits, so the large lenders stay free for large shares.
pub fn replacement(
    range: Range<u32>,
    layers: u32,
    need_mb: u64,
    idle: &[Candidate],
) -> Option<WorkerId> {
    idle.iter()
        .filter(|c| fits(c, need_mb, range.len() as u32, layers))
        .min_by(|a, b| {
            let key = |c: &Candidate| if c.lend_mb == 0 { u64::MAX } else { c.lend_mb };
            key(a).cmp(&key(b)).then(a.worker.cmp(&b.worker))
        })
        .map(|c| c.worker.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(name: &str, lend_mb: u64) -> Candidate {
        Candidate {
            worker: WorkerId::new(name).unwrap_or_else(|e| panic!("{e}")),
            lend_mb,
            device: "cpu".into(),
            layer_ns: 0,
        }
    }

    #[test]
    fn measured_speed_shares_layers_where_memory_allows() {
        let fast = |name: &str, lend_mb: u64, layer_ns: u32| Candidate {
            layer_ns,
            ..cand(name, lend_mb)
        };
        // Twice as fast: twice the layers.
        let idle = [fast("a-1", 8000, 1000), fast("b-1", 8000, 2000)];
        let g = form(2, 30, 1000, &idle, &[]).unwrap_or_else(|e| panic!("{e}"));
        let got: Vec<_> = g.iter().map(|m| (m.first_layer, m.end_layer)).collect();
        assert_eq!(got, [(0, 20), (20, 30)]);
        // Unless the fast one cannot hold 20 of 30 layers of 1000 MB: then
        // by lent memory.
        let idle = [fast("a-1", 600, 1000), fast("b-1", 600, 2000)];
        let g = form(2, 30, 1000, &idle, &[]).unwrap_or_else(|e| panic!("{e}"));
        let got: Vec<_> = g.iter().map(|m| (m.first_layer, m.end_layer)).collect();
        assert_eq!(got, [(0, 15), (15, 30)]);
        // One never measured: by lent memory.
        let idle = [fast("a-1", 8000, 1000), fast("b-1", 8000, 0)];
        let g = form(2, 30, 1000, &idle, &[]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(g[0].end_layer, 15);
    }

    #[test]
    fn a_model_no_worker_holds_gets_the_smallest_group_that_does() {
        let idle = [
            cand("a-1", 12_000),
            cand("b-1", 12_000),
            cand("c-1", 12_000),
            cand("d-1", 12_000),
        ];
        let two = smallest(80, 20_000, &idle).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(two.len(), 2);
        let three = smallest(80, 30_000, &idle).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(three.len(), 3);
        let e = smallest(80, 60_000, &idle).err().unwrap_or_default();
        assert!(
            e.contains("no group of up to 4 idle workers does (4 idle, lending 48000 MB"),
            "{e}"
        );
    }

    #[test]
    fn layers_follow_lent_memory_and_every_member_gets_one() {
        assert_eq!(ranges(30, &[8000, 8000]), vec![0..15, 15..30]);
        assert_eq!(ranges(30, &[16000, 8000]), vec![0..20, 20..30]);
        assert_eq!(ranges(30, &[1, 1, 1]), vec![0..10, 10..20, 20..30]);
        // Unknown memory: equal shares.
        assert_eq!(ranges(30, &[0, 24000]), vec![0..15, 15..30]);
        // A tiny lender still holds a layer.
        let r = ranges(30, &[100_000, 1]);
        assert_eq!(r, vec![0..29, 29..30]);
        for lends in [&[3u64, 5, 7][..], &[1, 1], &[9, 1, 1, 1]] {
            for layers in [4u32, 7, 30, 80] {
                let r = ranges(layers, lends);
                assert_eq!(r.len(), lends.len());
                assert_eq!(r[0].start, 0);
                assert_eq!(r.last().map(|x| x.end), Some(layers));
                assert!(r.windows(2).all(|w| w[0].end == w[1].start));
                assert!(
                    r.iter().all(|x| !x.is_empty()),
                    "{layers} over {lends:?}: {r:?}"
                );
            }
        }
    }

    #[test]
    fn an_asked_split_fixes_the_ranges_and_big_shares_go_to_big_lenders() {
        let idle = [cand("a-1", 1000), cand("b-1", 3000), cand("c-1", 2000)];
        let g = form(2, 30, 100, &idle, &[7, 23]).unwrap_or_else(|e| panic!("{e}"));
        let got: Vec<_> = g
            .iter()
            .map(|m| (m.worker.to_string(), m.first_layer, m.end_layer))
            .collect();
        assert_eq!(got, [("c-1".into(), 0, 7), ("b-1".into(), 7, 30)]);
        let g = form(3, 30, 100, &idle, &[1, 1, 1]).unwrap_or_else(|e| panic!("{e}"));
        let got: Vec<_> = g.iter().map(|m| (m.first_layer, m.end_layer)).collect();
        assert_eq!(got, [(0, 10), (10, 20), (20, 30)]);
        // A share a member cannot hold: no group.
        let tight = [cand("a-1", 600), cand("b-1", 600)];
        assert!(form(2, 30, 1000, &tight, &[1, 1]).is_ok());
        assert!(form(2, 30, 1000, &tight, &[1, 3]).is_err());
    }

    #[test]
    fn a_group_forms_only_where_every_share_fits() {
        let idle = [
            cand("a-1", 30_000),
            cand("b-1", 20_000),
            cand("c-1", 10_000),
        ];
        // 40 GB over the two lending most: 24 and 16 GB shares.
        let g = form(2, 80, 40_000, &idle, &[]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].worker.as_str(), "a-1");
        assert_eq!(
            (g[0].first_layer, g[0].end_layer, g[1].end_layer),
            (0, 48, 80)
        );
        // 60 GB: no two lend enough.
        let e = form(2, 80, 60_000, &idle, &[]).err().unwrap_or_default();
        assert!(e.contains("no group of 2 workers lends 60000 MB"), "{e}");
        // Too few idle workers.
        let e = form(4, 80, 10, &idle, &[]).err().unwrap_or_default();
        assert!(e.contains("3 idle worker(s) of the 4"), "{e}");
        // A replacement for a 15-layer share of a 30-layer, 300 MB model
        // (150 MB): the smallest that fits.
        let spare = [cand("x-1", 100), cand("y-1", 200), cand("z-1", 4000)];
        assert_eq!(
            replacement(15..30, 30, 300, &spare).map(|w| w.to_string()),
            Some("y-1".into())
        );
        assert_eq!(replacement(0..30, 30, 9000, &spare), None);
    }
}
