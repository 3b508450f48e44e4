//! Issue 34's targets, stated with real OSU under the multi-node launch, per row:
//!
//! - `osu_iallreduce`, `osu_ibarrier`, `osu_ibcast`, 4–256 B (the barrier has no size),
//!   any shape: OSU's overlap ≥ 80 % with innet, and pure latency ≥ 1.5× MPI's;
//! - `osu_allgather`, `osu_reduce_scatter` at 16 nodes × 1 rank: ≥ 1.5× MPI at 4–256 B,
//!   never slower than MPI (≥ 1.0×) at any size.
//!
//! Issue 45's, where issue 34 states none:
//!
//! - the blocking collectives (`osu_allreduce`, `osu_allgather`, `osu_reduce_scatter`,
//!   `osu_bcast`, `osu_barrier`) at every size and shape: ≥ 0.97× MPI, innet in the process
//!   costs no call it does not serve and serves none slower;
//! - the point-to-point benchmarks (`osu_latency`, `osu_bw`), which make no collective
//!   innet serves: ≥ 0.98×.
//!
//! A row whose either side did not finish misses its target.

use super::OsuRow;

/// Least overlap (%) the non-blocking benchmarks must reach with innet.
pub const OVERLAP_PCT: f64 = 80.0;
/// Least MPI µs / innet µs at the small sizes.
pub const SMALL_GAIN: f64 = 1.5;
/// The small sizes.
pub const SMALL: std::ops::RangeInclusive<usize> = 4..=256;
/// The shape the gather targets are stated at.
pub const GATHER_SHAPE: (usize, usize) = (16, 1);
/// Least MPI µs / innet µs of a blocking collective (issue 45: never slower).
pub const NEVER_SLOWER: f64 = 0.97;
/// Least MPI µs / innet µs of a benchmark innet serves nothing of.
pub const UNTOUCHED: f64 = 0.98;

/// The target `r` is held to (`None`: none for its benchmark, shape or size) and whether
/// it is met.
#[must_use]
pub fn check(r: &OsuRow) -> (Option<String>, Option<bool>) {
    let ratio = r.ratio.unwrap_or(0.0);
    let (target, met) = match r.test.as_str() {
        "iallreduce" | "ibcast" | "ibarrier"
            if SMALL.contains(&r.bytes) || r.test == "ibarrier" =>
        {
            let overlap = r.innet.as_ref().and_then(|t| t.overlap_pct).unwrap_or(0.0);
            (
                format!("overlap ≥ {OVERLAP_PCT:.0} %, ≥ {SMALL_GAIN}×"),
                overlap >= OVERLAP_PCT && ratio >= SMALL_GAIN,
            )
        }
        "allgather" | "reduce_scatter" if (r.nodes, r.ppn) == GATHER_SHAPE => {
            if SMALL.contains(&r.bytes) {
                (format!("≥ {SMALL_GAIN}×"), ratio >= SMALL_GAIN)
            } else {
                ("≥ 1.0×".into(), ratio >= 1.0)
            }
        }
        "allreduce" | "allgather" | "reduce_scatter" | "bcast" | "barrier" => {
            (format!("≥ {NEVER_SLOWER}×"), ratio >= NEVER_SLOWER)
        }
        "latency" | "bw" => (format!("≥ {UNTOUCHED}×"), ratio >= UNTOUCHED),
        _ => return (None, None),
    };
    (Some(target), Some(met))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::osu::Times;

    fn row(
        test: &str,
        (nodes, ppn): (usize, usize),
        bytes: usize,
        ratio: f64,
        overlap: f64,
    ) -> OsuRow {
        OsuRow {
            test: test.into(),
            flavour: "openmpi".into(),
            osu_version: "7.4".into(),
            nodes,
            ppn,
            bytes,
            launch: "multi-node".into(),
            settings: String::new(),
            mpi: None,
            mpi_again: None,
            innet: Some(Times {
                overlap_pct: Some(overlap),
                ..Times::default()
            }),
            mpi_us: Some(10.0),
            ratio: Some(ratio),
            served: 0,
            passed: 0,
            to_mpi: 0,
            calls: 0,
            fallbacks: 0,
            way: None,
            target: None,
            met: None,
            failed: vec![],
        }
    }

    #[test]
    fn nonblocking_targets_need_overlap_and_gain_at_small_sizes() {
        assert_eq!(
            check(&row("iallreduce", (4, 1), 4, 1.6, 85.0)).1,
            Some(true)
        );
        assert_eq!(
            check(&row("iallreduce", (4, 1), 4, 1.6, 79.9)).1,
            Some(false)
        );
        assert_eq!(
            check(&row("ibcast", (16, 1), 256, 1.4, 95.0)).1,
            Some(false)
        );
        assert_eq!(check(&row("ibarrier", (4, 1), 0, 2.0, 80.0)).1, Some(true));
        // Beyond 256 B no target.
        assert_eq!(
            check(&row("iallreduce", (4, 1), 512, 0.5, 0.0)),
            (None, None)
        );
        // innet did not finish: missed.
        let mut r = row("ibcast", (4, 1), 4, 2.0, 90.0);
        (r.innet, r.ratio) = (None, None);
        assert_eq!(check(&r).1, Some(false));
    }

    #[test]
    fn gather_targets_hold_at_16_nodes_only() {
        let (t, met) = check(&row("allgather", (16, 1), 64, 1.5, 0.0));
        assert_eq!((t.as_deref(), met), (Some("≥ 1.5×"), Some(true)));
        assert_eq!(
            check(&row("reduce_scatter", (16, 1), 4, 1.2, 0.0)).1,
            Some(false)
        );
        let (t, met) = check(&row("reduce_scatter", (16, 1), 65_536, 0.99, 0.0));
        assert_eq!((t.as_deref(), met), (Some("≥ 1.0×"), Some(false)));
        // Elsewhere issue 45's: never slower than MPI.
        let (t, met) = check(&row("allgather", (4, 1), 4, 0.96, 0.0));
        assert_eq!((t.as_deref(), met), (Some("≥ 0.97×"), Some(false)));
        assert_eq!(check(&row("barrier", (4, 4), 0, 0.97, 0.0)).1, Some(true));
    }

    #[test]
    fn what_innet_does_not_serve_runs_as_fast_as_mpi() {
        let (t, met) = check(&row("latency", (2, 1), 8, 0.98, 0.0));
        assert_eq!((t.as_deref(), met), (Some("≥ 0.98×"), Some(true)));
        assert_eq!(check(&row("bw", (2, 1), 65_536, 0.97, 0.0)).1, Some(false));
    }
}
