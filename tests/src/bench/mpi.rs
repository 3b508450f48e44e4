//! Unmodified MPI under `mpirun`: `osu_allreduce` (int32 SUM, the program checks every
//! result and aborts on a wrong one) with and without the interposer, for Debian's OpenMPI
//! and MPICH, on the 4-node fabric of the latency sweep, side by side in the same run.
//!
//! Without the interposer, MPI reduces through its own shared-memory transport (all ranks
//! share this machine); with it, innet serves the allreduces through the XDP switches. The
//! interposer's reports say how many it served and how many fell back.

use std::{ffi::OsString, path::Path};

use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

use super::latency::shape_for;
use crate::{
    daemons::{daemons_on, learn_hosts},
    mpi::{Flavour, MpiRun, reports},
    topology::Topology,
};

/// Nodes of the fabric (one rank per node).
pub const NODES: usize = 4;

/// What to run.
#[derive(Clone, Debug)]
pub struct MpiSweep {
    pub flavours: Vec<Flavour>,
    pub sizes: Vec<usize>,
    /// Timed iterations up to 8 KiB (osu_allreduce runs a tenth beyond).
    pub iterations: usize,
}

impl MpiSweep {
    /// Progress steps: one per mpirun.
    #[must_use]
    pub fn steps(&self) -> u64 {
        2 * self.flavours.len() as u64
    }
}

/// One size of one run: osu_allreduce's columns, and what the interposer did.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MpiRow {
    /// `openmpi` or `mpich`.
    pub flavour: String,
    /// Whether innet's interposer was preloaded.
    pub innet: bool,
    pub ranks: usize,
    pub bytes: usize,
    pub iterations: usize,
    /// The ranks' average, min and max of their mean latency (µs), as OSU reports them.
    pub avg_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    /// Allreduces innet served through the switches in the whole run (rank 0's count).
    pub served: u64,
    /// Calls that fell back to the hosts, or were passed to MPI, with the interposer (all ranks).
    pub fallbacks: u64,
    /// 1 when the run failed (a wrong result aborts it): no numbers then.
    pub errors: usize,
}

/// Runs the sweep on a fresh fabric; a failed run becomes one row with `errors` set.
#[must_use]
pub fn run(sweep: &MpiSweep, scratch: &Path, progress: &ProgressBar) -> Vec<MpiRow> {
    progress.set_message(format!("building the {NODES}-node fabric for mpirun"));
    let topo = Topology::new(shape_for(NODES));
    learn_hosts(&topo);
    let _daemons = daemons_on(&topo, &[]);
    let mut rows = vec![];
    for &flavour in &sweep.flavours {
        for innet in [false, true] {
            progress.set_message(format!(
                "osu_allreduce, {}{}",
                flavour.name(),
                if innet { " + innet" } else { "" }
            ));
            rows.extend(run_one(&topo, sweep, flavour, innet, scratch));
            progress.inc(1);
        }
    }
    rows
}

fn run_one(
    topo: &Topology,
    sweep: &MpiSweep,
    flavour: Flavour,
    innet: bool,
    scratch: &Path,
) -> Vec<MpiRow> {
    let dir = scratch.join(format!("{}-{innet}", flavour.name()));
    let reports_dir = dir.join("reports");
    std::fs::create_dir_all(&reports_dir).expect("the MPI scratch directory");
    let iterations = sweep.iterations.to_string();
    let warmup = (sweep.iterations / 10).max(10).to_string();
    let mut program: Vec<OsString> = vec![
        flavour.program("osu_allreduce").into(),
        "-i".into(),
        iterations.into(),
        "-w".into(),
        warmup.into(),
    ];
    program.extend(sweep.sizes.iter().map(|b| b.to_string().into()));
    let mut mpirun = MpiRun::new(flavour, NODES, &program);
    mpirun = if innet {
        mpirun.innet(topo, 1, &dir, &reports_dir)
    } else {
        mpirun.without_interposer()
    };
    let out = mpirun.command().output().expect("spawn mpirun");
    // What every row of this run shares; a failed run is this row alone, marked.
    let run = MpiRow {
        flavour: flavour.name().into(),
        innet,
        ranks: NODES,
        bytes: 0,
        iterations: 0,
        avg_us: 0.0,
        min_us: 0.0,
        max_us: 0.0,
        served: 0,
        fallbacks: 0,
        errors: 0,
    };
    let failed = |why: String| {
        eprintln!(
            "osu_allreduce ({}, innet {innet}) failed: {why}",
            flavour.name()
        );
        vec![MpiRow {
            errors: 1,
            ..run.clone()
        }]
    };
    if !out.status.success() {
        return failed(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let (served, fallbacks) = if innet {
        let all = reports(&reports_dir, NODES);
        let passed: u64 = all
            .iter()
            .map(|r| r.passed.values().sum::<u64>() + r.fallbacks)
            .sum();
        (all[0].network, passed)
    } else {
        (0, 0)
    };
    let rows = parse(&String::from_utf8_lossy(&out.stdout));
    if rows.len() != sweep.sizes.len() {
        return failed(format!(
            "{} of {} sizes reported",
            rows.len(),
            sweep.sizes.len()
        ));
    }
    rows.into_iter()
        .map(|(bytes, avg_us, min_us, max_us, iterations)| MpiRow {
            bytes,
            iterations,
            avg_us,
            min_us,
            max_us,
            served,
            fallbacks,
            ..run.clone()
        })
        .collect()
}

/// osu_allreduce's data lines: `bytes avg min max iterations` (comments start with `#`).
fn parse(stdout: &str) -> Vec<(usize, f64, f64, f64, usize)> {
    stdout
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                [b, avg, min, max, n] => Some((
                    b.parse().ok()?,
                    avg.parse().ok()?,
                    min.parse().ok()?,
                    max.parse().ok()?,
                    n.parse().ok()?,
                )),
                _ => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn reads_osu_columns_and_skips_comments() {
        let out = "# osu_allreduce int32 SUM, 4 ranks\n# bytes avg_us min_us max_us iterations\n\
                   4 51.20 50.10 52.30 1000\n65536 900.5 880.0 910.0 100\n";
        assert_eq!(
            parse(out),
            vec![
                (4, 51.2, 50.1, 52.3, 1000),
                (65_536, 900.5, 880.0, 910.0, 100)
            ]
        );
    }
}
