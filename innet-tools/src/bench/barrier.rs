//! What a barrier leaves behind (issue 45 item 3): `barrier_skew` under the multi-node
//! launch, plain MPI and with innet's interposer (nothing set), per shape. How far apart
//! the barrier releases the ranks (the wall clock each reads on its way out; the lab's
//! ranks share one clock), and what the next call MPI serves itself then costs (an 8-byte
//! `MPI_Sendrecv` around a ring, the slowest rank's): a barrier that releases every rank at
//! once onto shared CPUs can make that call slower.
//!
//! Per shape, the four runs of [`Run`]: a discarded warm-up, plain, + innet, plain again.

use std::path::Path;

use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

use super::{
    mpi::{launch, on_fabrics},
    side_by_side::{Run, counts, failures, mpirun_failed, value},
};
use crate::markdown::Table;
use innet_lab::{mpi::Flavour, topology::Topology};

/// One mpirun of `barrier_skew`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BarrierRow {
    pub nodes: usize,
    pub ppn: usize,
    /// `MPI, warm-up (discarded)`, `MPI`, `+ innet` or `MPI, again`.
    pub run: String,
    pub innet: bool,
    pub iterations: u64,
    /// The mean and median of the latest release less the earliest, µs.
    pub skew_us: f64,
    pub skew_p50_us: f64,
    /// The next call's mean time on the slowest rank, µs.
    pub next_us: f64,
    /// The barrier's mean time on the slowest rank, µs.
    pub barrier_us: f64,
    pub failed: Option<String>,
}

/// Runs `barrier_skew` (`iterations` timed) at each shape, a fresh fabric per node count.
#[must_use]
pub fn run(
    shapes: &[(usize, usize)],
    iterations: usize,
    scratch: &Path,
    progress: &ProgressBar,
) -> Vec<BarrierRow> {
    on_fabrics(
        (shapes, None),
        "barrier_skew",
        progress,
        |topo, (nodes, ppn)| {
            let mut rows = vec![];
            for run in Run::ALL {
                progress.set_message(format!(
                    "barrier_skew, {nodes} nodes × {ppn}, {}",
                    run.name()
                ));
                let dir = scratch.join(format!("barrier-{nodes}x{ppn}-{}", run.tag()));
                rows.push(run_one(topo, (nodes, ppn), run, iterations, &dir));
                progress.inc(1);
            }
            rows
        },
    )
}

fn run_one(
    topo: &Topology,
    (nodes, ppn): (usize, usize),
    run: Run,
    iterations: usize,
    dir: &Path,
) -> BarrierRow {
    let reports = dir.join("reports");
    std::fs::create_dir_all(&reports).expect("the barrier run's scratch directory");
    let flavour = Flavour::OpenMpi;
    let program = [
        flavour.program("barrier_skew").into(),
        "-i".into(),
        iterations.to_string().into(),
        "-w".into(),
        (iterations / 10).max(10).to_string().into(),
    ];
    let mpirun = launch(
        topo,
        flavour,
        (nodes * ppn, ppn),
        &program,
        run.innet().then_some(reports.as_path()),
    );
    let mut row = BarrierRow {
        nodes,
        ppn,
        run: run.name().into(),
        innet: run.innet(),
        ..BarrierRow::default()
    };
    let out = mpirun.output().expect("spawn mpirun");
    let stdout = String::from_utf8_lossy(&out.stdout);
    match parse(&stdout).filter(|_| out.status.success()) {
        Some(p) => {
            (
                row.iterations,
                row.skew_us,
                row.skew_p50_us,
                row.next_us,
                row.barrier_us,
            ) = p;
        }
        None => row.failed = Some(mpirun_failed(&out)),
    }
    row
}

/// `barrier_skew`'s line: iterations, skew mean and median, next call, barrier.
fn parse(out: &str) -> Option<(u64, f64, f64, f64, f64)> {
    let line = out.lines().find(|l| l.starts_with("barrier_skew "))?;
    let field = |key: &str| -> Option<f64> { value(line, key)?.parse().ok() };
    Some((
        value(line, "iterations")?.parse().ok()?,
        field("skew_us")?,
        field("skew_p50_us")?,
        field("next_us")?,
        field("barrier_us")?,
    ))
}

/// The report's section: per shape, plain MPI (the mean of the runs before and after)
/// beside + innet.
#[must_use]
pub fn markdown(rows: &[BarrierRow]) -> String {
    let mut s = String::from("## What a barrier leaves behind\n\n");
    s += "`barrier_skew` under the multi-node launch: each iteration an `MPI_Barrier`, every \
          rank reading the wall clock on its way out, then an 8-byte `MPI_Sendrecv` around a \
          ring (MPI's own call). *Skew*: the latest release less the earliest (mean, \
          median); *next call*: the slowest rank's Sendrecv; *barrier*: the slowest rank's \
          barrier. MPI: the mean of the plain runs before and after + innet's.\n\n";
    let mut t = Table::numbers([
        "shape",
        "skew, MPI / + innet",
        "median skew",
        "next call, MPI / + innet",
        "barrier, MPI / + innet",
    ]);
    let mut shapes: Vec<(usize, usize)> = rows.iter().map(|r| (r.nodes, r.ppn)).collect();
    shapes.dedup();
    let us = |m: f64, i: f64| format!("{m:.1} / {i:.1} µs");
    for (nodes, ppn) in shapes {
        let of = |innet: bool| {
            let these: Vec<&BarrierRow> = rows
                .iter()
                .filter(|r| {
                    (r.nodes, r.ppn) == (nodes, ppn)
                        && r.innet == innet
                        && counts(&r.run, r.failed.is_some())
                })
                .collect();
            let n = these.len().max(1) as f64;
            let mean = |f: fn(&BarrierRow) -> f64| these.iter().map(|r| f(r)).sum::<f64>() / n;
            (
                mean(|r| r.skew_us),
                mean(|r| r.skew_p50_us),
                mean(|r| r.next_us),
                mean(|r| r.barrier_us),
            )
        };
        let (mpi, innet) = (of(false), of(true));
        t.row([
            format!("{nodes} × {ppn}"),
            us(mpi.0, innet.0),
            us(mpi.1, innet.1),
            us(mpi.2, innet.2),
            us(mpi.3, innet.3),
        ]);
    }
    s += &t.to_string();
    s += &failures(rows.iter().filter_map(|r| {
        let what = format!("{} × {} {}", r.nodes, r.ppn, r.run);
        Some((what, r.failed.as_deref()?))
    }));
    s += "\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_programs_line_parses() {
        let out = "barrier_skew iterations=100 skew_us=12.50 skew_p50_us=10.00 next_us=80.25 \
                   barrier_us=55.00\n";
        assert_eq!(parse(out), Some((100, 12.5, 10.0, 80.25, 55.0)));
        assert_eq!(parse("nothing"), None);
    }
}
