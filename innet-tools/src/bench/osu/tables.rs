//! The OSU section of the markdown report: one table per benchmark, shape and flavour.

use std::fmt::Write as _;

use super::OsuRow;
use crate::markdown::{
    Align::{self, Left, Right},
    Table,
};

/// The section, from the rows alone.
#[must_use]
pub fn markdown(rows: &[OsuRow]) -> String {
    let mut s = String::from(
        "## Real OSU micro-benchmarks: MPI and MPI + innet (issue 34)\n\n\
         OSU's own benchmarks, built from its source (`cargo xtask osu`), under the \
         multi-node launch; *MPI* is unmodified MPI, the mean of a run before and a run \
         after the interposed one (*before / after*); *+ innet* preloads innet's interposer \
         and sets nothing else (placement found, cutover learned). µs averaged over the \
         ranks as OSU prints them. Blocking benchmarks: `Avg Latency(us)`. Non-blocking: \
         *pure* is OSU's `Pure Comm.(us)` (the collective and its wait, nothing to overlap); \
         *overall* the call with OSU's dummy computation (sized to the pure latency) \
         between the start and the wait, *compute* that computation; *overlap* is OSU's \
         `100 − (overall − compute) / pure × 100`. *gain*: MPI µs / innet µs. *way*: what \
         rank 0's learned cutover chose for the size. *target*: issue 34's, else issue \
         45's, ✓ met, ✗ not. \
         ⚠: the two plain runs differ by more than 1.5×, so the MPI mean and the gain \
         are unsteady. Point-to-point (`osu_latency`, `osu_bw`: two nodes, one rank each) \
         make no collective innet serves: they show what innet in the process costs \
         MPI's own traffic; `osu_bw` in MB/s, its gain innet's bandwidth over MPI's.\n\n",
    );
    let mut groups: Vec<(&str, usize, usize, &str)> = rows
        .iter()
        .map(|r| (r.test.as_str(), r.nodes, r.ppn, r.flavour.as_str()))
        .collect();
    groups.dedup();
    for (test, nodes, ppn, flavour) in groups {
        let these: Vec<&OsuRow> = rows
            .iter()
            .filter(|r| {
                (r.test.as_str(), r.nodes, r.ppn, r.flavour.as_str()) == (test, nodes, ppn, flavour)
            })
            .collect();
        s += &table(test, (nodes, ppn), flavour, &these);
    }
    s
}

fn table(test: &str, (nodes, ppn): (usize, usize), flavour: &str, rows: &[&OsuRow]) -> String {
    let nonblocking = test.starts_with('i');
    let Some(first) = rows.first() else {
        return String::new();
    };
    let mut s = format!(
        "### osu_{test}, {nodes} nodes × {ppn}, {flavour} (OSU {})\n\n",
        first.osu_version
    );
    let bandwidth = test == "bw";
    let mut table = Table::aligned(columns(bandwidth, nonblocking));
    let us = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.1}"));
    let pct = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.0} %"));
    for r in rows {
        let before = us(r.mpi.as_ref().map(|t| t.latency_us));
        let after = us(r.mpi_again.as_ref().map(|t| t.latency_us));
        let innet = r.innet.as_ref();
        let gain = r.ratio.map_or("–".into(), |g| format!("{g:.2}×"));
        let mpi = us(r.mpi_us) + if unsteady(r) { " ⚠" } else { "" };
        let target = match (&r.target, r.met) {
            (Some(t), Some(true)) => format!("✓ {t}"),
            (Some(t), _) => format!("✗ {t}"),
            (None, _) => "–".into(),
        };
        let way = r.way.as_deref().unwrap_or("–");
        let bytes = if super::sized(test) {
            r.bytes.to_string()
        } else {
            "–".into()
        };
        if bandwidth {
            table.row(bandwidth_row(r, bytes, gain, target));
        } else if nonblocking {
            let mpi_overlap = [&r.mpi, &r.mpi_again]
                .into_iter()
                .flatten()
                .filter_map(|t| t.overlap_pct)
                .collect::<Vec<_>>();
            let mpi_overlap = (!mpi_overlap.is_empty())
                .then(|| mpi_overlap.iter().sum::<f64>() / mpi_overlap.len() as f64);
            table.row([
                bytes,
                mpi,
                format!("{before} / {after}"),
                us(innet.map(|t| t.latency_us)),
                gain,
                pct(mpi_overlap),
                pct(innet.and_then(|t| t.overlap_pct)),
                format!(
                    "{} / {}",
                    us(innet.and_then(|t| t.overall_us)),
                    us(innet.and_then(|t| t.compute_us))
                ),
                way.to_string(),
                target,
            ]);
        } else {
            table.row([
                bytes,
                mpi,
                format!("{before} / {after}"),
                us(innet.map(|t| t.latency_us)),
                gain,
                way.to_string(),
                target,
            ]);
        }
    }
    s += &table.to_string();
    s += &footnote(test, first, rows);
    s
}

/// A table's columns: `osu_bw`'s bandwidths, a non-blocking benchmark's pure latency and
/// overlap, or a blocking one's latency.
fn columns(bandwidth: bool, nonblocking: bool) -> Vec<(&'static str, Align)> {
    if bandwidth {
        vec![
            ("bytes", Right),
            ("MPI MB/s", Right),
            ("before / after", Right),
            ("+ innet MB/s", Right),
            ("gain", Right),
            ("target", Left),
        ]
    } else if nonblocking {
        vec![
            ("bytes", Right),
            ("MPI pure", Right),
            ("before / after", Right),
            ("+ innet pure", Right),
            ("gain", Right),
            ("MPI overlap", Right),
            ("+ innet overlap", Right),
            ("+ innet overall / compute", Right),
            ("way", Left),
            ("target", Left),
        ]
    } else {
        vec![
            ("bytes", Right),
            ("MPI", Right),
            ("before / after", Right),
            ("+ innet", Right),
            ("gain", Right),
            ("way", Left),
            ("target", Left),
        ]
    }
}

/// What the interposer did in the innet run, the launch, and the runs that failed.
fn footnote(test: &str, first: &OsuRow, rows: &[&OsuRow]) -> String {
    let mut s = if super::point_to_point(test) {
        "\n+ innet: the interposer loaded, its placement found at `MPI_Init`; the benchmark \
         makes no collective it serves."
            .to_string()
    } else {
        format!(
            "\n+ innet: rank 0's interposer served {} of the run's {} `{test}` calls per rank \
             through innet, passed {} to MPI ({} by the learned cutover; the rest of the \
             calls never reached innet); {} calls fell back to the hosts on all ranks.{}",
            first.served,
            first.calls,
            first.passed,
            first.to_mpi,
            first.fallbacks,
            if rows.iter().any(|r| r.wrong()) {
                " **OSU's validation failed.**"
            } else {
                ""
            },
        )
    };
    let _ = writeln!(s, "\n\nLaunch `{}`: {}.\n", first.launch, first.settings);
    for f in &first.failed {
        let _ = writeln!(s, "✗ {f}\n");
    }
    s
}

/// One row of `osu_bw`: MB/s, the MPI column the plain runs' mean time as a bandwidth.
fn bandwidth_row(r: &OsuRow, bytes: String, gain: String, target: String) -> [String; 6] {
    let mbs = |us: Option<f64>| us.map_or("–".into(), |us| format!("{:.1}", r.bytes as f64 / us));
    let own = |t: Option<&super::Times>| {
        t.and_then(|t| t.bandwidth_mbs)
            .map_or("–".into(), |v| format!("{v:.1}"))
    };
    [
        bytes,
        mbs(r.mpi_us) + if unsteady(r) { " ⚠" } else { "" },
        format!("{} / {}", own(r.mpi.as_ref()), own(r.mpi_again.as_ref())),
        own(r.innet.as_ref()),
        gain,
        target,
    ]
}

/// Whether the plain runs before and after differ by more than 1.5×.
fn unsteady(r: &OsuRow) -> bool {
    match (&r.mpi, &r.mpi_again) {
        (Some(a), Some(b)) => {
            let (lo, hi) = if a.latency_us < b.latency_us {
                (a.latency_us, b.latency_us)
            } else {
                (b.latency_us, a.latency_us)
            };
            hi > 1.5 * lo
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{bench::osu::Times, markdown::squeezed};

    #[test]
    fn a_table_shows_both_sides_the_gain_counts_and_the_target() {
        let t = |lat: f64, overlap: f64| Times {
            bytes: 4,
            latency_us: lat,
            overall_us: Some(lat * 1.2),
            compute_us: Some(lat),
            overlap_pct: Some(overlap),
            ..Times::default()
        };
        let row = OsuRow {
            test: "iallreduce".into(),
            flavour: "openmpi".into(),
            osu_version: "7.4".into(),
            nodes: 4,
            ppn: 1,
            bytes: 4,
            launch: "multi-node".into(),
            settings: "pml=ob1".into(),
            mpi: Some(t(40.0, 10.0)),
            mpi_again: Some(t(44.0, 20.0)),
            innet: Some(t(20.0, 85.0)),
            mpi_us: Some(42.0),
            ratio: Some(2.1),
            served: 1540,
            passed: 0,
            to_mpi: 0,
            calls: 1540,
            fallbacks: 0,
            way: Some("network".into()),
            target: Some("overlap ≥ 80 %, ≥ 1.5×".into()),
            met: Some(true),
            failed: vec![],
        };
        let md = squeezed(&markdown(std::slice::from_ref(&row)));
        assert!(
            md.contains("### osu_iallreduce, 4 nodes × 1, openmpi (OSU 7.4)"),
            "{md}"
        );
        assert!(
            md.contains("| 4 | 42.0 | 40.0 / 44.0 | 20.0 | 2.10× | 15 % | 85 % | 24.0 / 20.0 | network | ✓ overlap ≥ 80 %, ≥ 1.5× |"),
            "{md}"
        );
        assert!(
            md.contains("served 1540 of the run's 1540 `iallreduce` calls"),
            "{md}"
        );
        assert!(md.contains("Launch `multi-node`: pml=ob1."), "{md}");
        let mut r2 = row;
        r2.mpi_again = Some(t(61.0, 20.0));
        let md = squeezed(&markdown(&[r2]));
        assert!(md.contains("| 4 | 42.0 ⚠ | 40.0 / 61.0 |"), "{md}");
    }
}
