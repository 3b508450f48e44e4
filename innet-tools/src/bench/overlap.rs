//! How much of a non-blocking collective hides behind computation (issue 45 item 2):
//! `nbc_overlap` under the multi-node launch, plain MPI and with innet's interposer
//! (nothing set), per shape and kind, with OSU's spinning computation and with one that
//! sleeps (a rank waiting for a GPU kernel or for I/O leaves its CPU to the rest of the
//! node, where an in-network collective can progress and MPI's cannot).
//!
//! Per shape and kind, the four runs of [`Run`]: a discarded warm-up, plain, + innet,
//! plain again; each run measures both computations at every size.

use std::path::Path;

use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

use super::{
    mpi::{launch, on_fabrics},
    side_by_side::{Run, counts, failures, mpirun_failed, value},
};
use crate::markdown::{
    Align::{Left, Right},
    Table,
};
use innet_lab::{mpi::Flavour, topology::Topology};

/// What the overlap runs measure.
#[derive(Clone, Debug)]
pub struct OverlapSweep {
    pub shapes: Vec<(usize, usize)>,
    /// `iallreduce`, `ibcast`, `ireduce`, `ibarrier`.
    pub kinds: Vec<String>,
    /// Smallest and largest message, bytes (powers of two between).
    pub sizes: (usize, usize),
    pub iterations: usize,
}

impl OverlapSweep {
    /// Progress steps: one per mpirun.
    #[must_use]
    pub fn steps(&self) -> u64 {
        (self.shapes.len() * self.kinds.len() * Run::ALL.len()) as u64
    }
}

/// One size of one computation in one mpirun of `nbc_overlap`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OverlapRow {
    pub nodes: usize,
    pub ppn: usize,
    pub kind: String,
    /// `MPI, warm-up (discarded)`, `MPI`, `+ innet` or `MPI, again`.
    pub run: String,
    pub innet: bool,
    /// `spin` (OSU's) or `sleep`.
    pub compute: String,
    pub bytes: usize,
    /// Start + wait alone, µs (the ranks' mean).
    pub pure_us: f64,
    /// Start, computation, wait, µs.
    pub overall_us: f64,
    pub compute_us: f64,
    /// The start call and the wait after the computation, µs.
    #[serde(default)]
    pub start_us: f64,
    #[serde(default)]
    pub wait_us: f64,
    /// A whole iteration of the overall run, its `MPI_Barrier` included, µs: the program's
    /// loop, where a barrier's cost to the call after it shows.
    #[serde(default)]
    pub iteration_us: f64,
    /// OSU's overlap: 100 × (1 − (overall − compute) / pure), at least 0.
    pub overlap_pct: f64,
    /// Calls whose result was wrong, over every rank.
    pub wrong: u64,
    pub failed: Option<String>,
}

/// Runs `nbc_overlap` for every shape and kind, a fresh fabric per node count.
#[must_use]
pub fn run(sweep: &OverlapSweep, scratch: &Path, progress: &ProgressBar) -> Vec<OverlapRow> {
    on_fabrics(
        (&sweep.shapes, None),
        "nbc_overlap",
        progress,
        |topo, shape| {
            let mut rows = vec![];
            for kind in &sweep.kinds {
                for run in Run::ALL {
                    progress.set_message(format!(
                        "nbc_overlap {kind}, {} nodes × {}, {}",
                        shape.0,
                        shape.1,
                        run.name()
                    ));
                    let dir = scratch.join(format!("{kind}-{}x{}-{}", shape.0, shape.1, run.tag()));
                    rows.extend(run_one(topo, shape, kind, run, sweep, &dir));
                    progress.inc(1);
                }
            }
            rows
        },
    )
}

fn run_one(
    topo: &Topology,
    (nodes, ppn): (usize, usize),
    kind: &str,
    run: Run,
    sweep: &OverlapSweep,
    dir: &Path,
) -> Vec<OverlapRow> {
    let reports = dir.join("reports");
    std::fs::create_dir_all(&reports).expect("the overlap run's scratch directory");
    let flavour = Flavour::OpenMpi;
    let program = [
        flavour.program("nbc_overlap").into(),
        "-k".into(),
        kind.into(),
        "-c".into(),
        "spin,sleep".into(),
        "-m".into(),
        format!("{}:{}", sweep.sizes.0, sweep.sizes.1).into(),
        "-i".into(),
        sweep.iterations.to_string().into(),
        "-x".into(),
        (sweep.iterations / 10).max(10).to_string().into(),
    ];
    let mpirun = launch(
        topo,
        flavour,
        (nodes * ppn, ppn),
        &program,
        run.innet().then_some(reports.as_path()),
    );
    let row = OverlapRow {
        nodes,
        ppn,
        kind: kind.into(),
        run: run.name().into(),
        innet: run.innet(),
        ..OverlapRow::default()
    };
    let out = mpirun.output().expect("spawn mpirun");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let _ = std::fs::write(dir.join("stdout.txt"), stdout.as_bytes());
    let rows: Vec<OverlapRow> = stdout.lines().filter_map(|l| parse(l, &row)).collect();
    if out.status.success() && !rows.is_empty() {
        return rows;
    }
    vec![OverlapRow {
        failed: Some(mpirun_failed(&out)),
        ..row
    }]
}

/// One line of `nbc_overlap`, on top of the run's fields in `base`.
fn parse(line: &str, base: &OverlapRow) -> Option<OverlapRow> {
    if !line.starts_with("nbc_overlap ") {
        return None;
    }
    let f = |key: &str| -> Option<f64> { value(line, key)?.parse().ok() };
    Some(OverlapRow {
        compute: value(line, "compute")?.to_string(),
        bytes: value(line, "bytes")?.parse().ok()?,
        pure_us: f("pure_us")?,
        overall_us: f("overall_us")?,
        compute_us: f("compute_us")?,
        start_us: f("start_us")?,
        wait_us: f("wait_us")?,
        iteration_us: f("iteration_us")?,
        overlap_pct: f("overlap_pct")?,
        wrong: value(line, "wrong")?.parse().ok()?,
        ..base.clone()
    })
}

/// Calls with a wrong result over every row.
#[must_use]
pub fn wrong(rows: &[OverlapRow]) -> u64 {
    rows.iter().map(|r| r.wrong).sum()
}

/// The report's section: per shape, kind, computation and size, plain MPI (the mean of
/// the runs before and after) beside + innet.
#[must_use]
pub fn markdown(rows: &[OverlapRow]) -> String {
    let mut s = String::from("## Non-blocking collectives behind computation\n\n");
    s += "`nbc_overlap` under the multi-node launch, OSU's method: *pure* is start + \
          `MPI_Wait`; *overall* is start, a computation as long as the pure call, `MPI_Wait`; \
          *overlap* = 100 × (1 − (overall − computation) / pure); *start* and *wait*: the \
          overall run's start call and its wait after the computation; *iteration*: the overall \
          run's whole loop per call, its `MPI_Barrier` included (what the program takes). \
          *spin*: the computation keeps its CPU (OSU's); *sleep*: it sleeps (a rank waiting for a GPU kernel or I/O). \
          Speed: MPI's time over + innet's (above 1: innet faster). MPI: the mean of the \
          plain runs before and after + innet's.\n\n";
    let mut t = Table::aligned([
        ("shape", Left),
        ("kind", Left),
        ("compute", Left),
        ("bytes", Right),
        ("pure, MPI / + innet", Right),
        ("speed", Right),
        ("overall, MPI / + innet", Right),
        ("speed", Right),
        ("iteration, MPI / + innet", Right),
        ("speed", Right),
        ("start, MPI / + innet", Right),
        ("wait, MPI / + innet", Right),
        ("overlap, MPI / + innet", Right),
        ("wrong", Right),
    ]);
    let mut keys: Vec<(usize, usize, &str, &str, usize)> = rows
        .iter()
        .filter(|r| r.failed.is_none())
        .map(|r| (r.nodes, r.ppn, r.kind.as_str(), r.compute.as_str(), r.bytes))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    let us = |m: f64, i: f64| format!("{m:.1} / {i:.1} µs");
    let speed = |m: f64, i: f64| format!("{:.2}×", m / i);
    for (nodes, ppn, kind, compute, bytes) in keys {
        let of = |innet: bool| {
            let these: Vec<&OverlapRow> = rows
                .iter()
                .filter(|r| {
                    (r.nodes, r.ppn, r.kind.as_str(), r.compute.as_str(), r.bytes)
                        == (nodes, ppn, kind, compute, bytes)
                        && r.innet == innet
                        && counts(&r.run, r.failed.is_some())
                })
                .collect();
            let n = these.len().max(1) as f64;
            let mean = |f: fn(&OverlapRow) -> f64| these.iter().map(|r| f(r)).sum::<f64>() / n;
            (
                mean(|r| r.pure_us),
                mean(|r| r.overall_us),
                mean(|r| r.overlap_pct),
                these.iter().map(|r| r.wrong).sum::<u64>(),
                mean(|r| r.start_us),
                mean(|r| r.wait_us),
                mean(|r| r.iteration_us),
            )
        };
        let (mpi, innet) = (of(false), of(true));
        t.row([
            format!("{nodes} × {ppn}"),
            kind.to_string(),
            compute.to_string(),
            bytes.to_string(),
            us(mpi.0, innet.0),
            speed(mpi.0, innet.0),
            us(mpi.1, innet.1),
            speed(mpi.1, innet.1),
            us(mpi.6, innet.6),
            speed(mpi.6, innet.6),
            us(mpi.4, innet.4),
            us(mpi.5, innet.5),
            format!("{:.0} / {:.0} %", mpi.2, innet.2),
            (mpi.3 + innet.3).to_string(),
        ]);
    }
    s += &t.to_string();
    s += &failures(rows.iter().filter_map(|r| {
        let what = format!("{} × {} {} {}", r.nodes, r.ppn, r.kind, r.run);
        Some((what, r.failed.as_deref()?))
    }));
    s += "\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_programs_lines_parse() {
        let base = OverlapRow {
            nodes: 4,
            ppn: 1,
            kind: "iallreduce".into(),
            ..OverlapRow::default()
        };
        let line = "nbc_overlap kind=iallreduce compute=sleep bytes=64 pure_us=50.00 \
                    overall_us=60.50 compute_us=49.75 start_us=2.00 wait_us=8.75 \
                    iteration_us=90.25 overlap_pct=78.5 wrong=0";
        let row = parse(line, &base).expect("parses");
        assert_eq!(row.compute, "sleep");
        assert_eq!(row.bytes, 64);
        assert!((row.overall_us - 60.5).abs() < 1e-9 && (row.overlap_pct - 78.5).abs() < 1e-9);
        assert!((row.start_us - 2.0).abs() < 1e-9 && (row.wait_us - 8.75).abs() < 1e-9);
        assert!((row.iteration_us - 90.25).abs() < 1e-9);
        assert_eq!(row.nodes, 4);
        assert_eq!(parse("barrier_skew iterations=1", &base), None);
        assert_eq!(parse("nbc_overlap kind=x compute=spin", &base), None);
    }

    #[test]
    fn the_report_puts_mpi_beside_innet() {
        let row = |run: Run, pure: f64, overlap: f64| OverlapRow {
            nodes: 4,
            ppn: 1,
            kind: "iallreduce".into(),
            run: run.name().into(),
            innet: run.innet(),
            compute: "sleep".into(),
            bytes: 4,
            pure_us: pure,
            overall_us: pure * 1.5,
            compute_us: pure,
            start_us: pure / 100.0,
            wait_us: pure / 50.0,
            iteration_us: pure * 3.0,
            overlap_pct: overlap,
            ..OverlapRow::default()
        };
        let rows = [
            row(Run::WarmUp, 1000.0, 0.0),
            row(Run::Plain, 100.0, 10.0),
            row(Run::Innet, 50.0, 90.0),
            row(Run::PlainAgain, 100.0, 30.0),
        ];
        let md = crate::markdown::squeezed(&markdown(&rows));
        // The warm-up is left out: MPI is 100 µs (overlap 20 %), innet 50 µs: 2×.
        assert!(
            md.contains("| 4 × 1 | iallreduce | sleep | 4 | 100.0 / 50.0 µs | 2.00× |"),
            "{md}"
        );
        assert!(md.contains("| 20 / 90 % | 0 |"), "{md}");
        assert!(
            md.contains("| 150.0 / 75.0 µs | 2.00× | 300.0 / 150.0 µs | 2.00× |"),
            "{md}"
        );
        assert!(md.contains("| 1.0 / 0.5 µs | 2.0 / 1.0 µs |"), "{md}");
    }
}
