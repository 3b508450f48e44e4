//! Unmodified MPI under `mpirun`: `osu_allreduce` (int32 SUM, the program checks every
//! result and aborts on a wrong one) with and without the interposer, for Debian's OpenMPI
//! (and MPICH), on the latency sweep's fabrics, side by side in the same run.
//!
//! MPI runs as users run it on a cluster ([`MpiRun::multi_node`]): one daemon per node,
//! the ranks of a node in its namespace with its hostname, shared memory between them and
//! TCP through the fabric's bridges between nodes, the scheduler's autogroups off; every
//! row says the launch and its settings. That is what a user runs instead of innet. With
//! the interposer, the same launch, and innet serves the allreduces through the XDP
//! switches; its reports say how many it served and how many went to MPI.

use std::{ffi::OsString, path::Path};

use indicatif::ProgressBar;
use innet_client::{
    Cutover, CutoverTable,
    cutover::{self, Measured},
};
use innet_mpi::{config::CUTOVER_VAR, session::LEARN_VAR};
use serde::{Deserialize, Serialize};

use super::{LatencyRow, latency::shape_for};
use crate::{
    daemons::{daemons_on, learn_hosts},
    mpi::{Flavour, MpiRun, Nodes, reports},
    topology::Topology,
};

/// Whether the interposer reads the placement file innet-lab writes (`INNET_MPI_CONFIG`);
/// off, it discovers the placement itself, as it will on a user's cluster.
pub const PLACEMENT_FILE: bool = true;

/// What to run.
#[derive(Clone, Debug)]
pub struct MpiSweep {
    pub flavours: Vec<Flavour>,
    /// (nodes, ranks per node) of each job.
    pub shapes: Vec<(usize, usize)>,
    pub sizes: Vec<usize>,
    /// Timed iterations up to 8 KiB (osu_allreduce runs a tenth beyond).
    pub iterations: usize,
    /// float64 SUM instead of int32 SUM (the goodput sweep's type).
    pub float64: bool,
}

impl MpiSweep {
    /// Progress steps: one per mpirun.
    #[must_use]
    pub fn steps(&self) -> u64 {
        3 * (self.flavours.len() * self.shapes.len()) as u64
    }
}

/// One size of one run: osu_allreduce's columns, and what the interposer did.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MpiRow {
    /// `openmpi` or `mpich`.
    pub flavour: String,
    /// Whether innet's interposer was preloaded.
    pub innet: bool,
    /// With the interposer: whether it read this run's cutover table (sizes MPI is faster
    /// for go to MPI).
    #[serde(default)]
    pub cutover: bool,
    /// `fabric`: every rank in its node's namespace, MPI over TCP through the bridges
    /// between nodes; `shm`: every rank in the root namespace (MPI's shared memory).
    #[serde(default = "shm")]
    pub transport: String,
    /// How mpirun started the ranks: `multi-node` (one daemon per node, shared memory
    /// within a node) or `tcp-all-ranks` (earlier runs: TCP between every pair of ranks).
    #[serde(default = "tcp_all_ranks")]
    pub launch: String,
    /// The launcher's settings that shape the measurement (`key=value` words).
    #[serde(default)]
    pub settings: String,
    /// Whether the interposer read a placement file (`INNET_MPI_CONFIG`).
    #[serde(default)]
    pub placement_file: bool,
    #[serde(default)]
    pub nodes: usize,
    #[serde(default = "one")]
    pub ppn: usize,
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

impl MpiRow {
    /// Which of a shape's runs this row belongs to, as the report names it.
    #[must_use]
    pub fn run_name(&self) -> &'static str {
        match (self.innet, self.cutover) {
            (false, _) => Variant::Plain.name(),
            (true, false) => Variant::Innet.name(),
            (true, true) => CUTOVER_RUN,
        }
    }
}

/// The name of the run with the cutover table.
const CUTOVER_RUN: &str = "+ innet, cutover";

fn shm() -> String {
    "shm".into()
}

fn tcp_all_ranks() -> String {
    "tcp-all-ranks".into()
}

const fn one() -> usize {
    1
}

/// The cutover rule `rows` call for (one flavour and shape): innet's sizes up to the first
/// one MPI over the fabric is faster for.
#[must_use]
pub fn rule(rows: &[MpiRow]) -> Option<Cutover> {
    let points: Vec<Measured> = rows
        .iter()
        .filter(|r| r.innet && !r.cutover && r.errors == 0)
        .filter_map(|i| {
            let plain = rows.iter().find(|p| {
                !p.innet && p.errors == 0 && (p.nodes, p.ppn, p.bytes) == (i.nodes, i.ppn, i.bytes)
            })?;
            Some(Measured {
                nodes: i.nodes,
                ppn: i.ppn,
                bytes: i.bytes,
                network_us: i.avg_us,
                host_us: plain.avg_us,
            })
        })
        .collect();
    cutover::derive(&points).into_iter().next()
}

/// Runs the sweep, a fresh fabric per node count; a failed run becomes one row with
/// `errors` set. Per shape and flavour: plain MPI, MPI with the interposer, and MPI with
/// the interposer reading the cutover table those two runs call for. Returns the rows and
/// the table's rules (the first flavour's).
#[must_use]
pub fn run(
    sweep: &MpiSweep,
    scratch: &Path,
    progress: &ProgressBar,
) -> (Vec<MpiRow>, Vec<Cutover>) {
    let mut rows = vec![];
    let mut rules = vec![];
    let mut node_counts: Vec<usize> = sweep.shapes.iter().map(|s| s.0).collect();
    node_counts.sort_unstable();
    node_counts.dedup();
    for nodes in node_counts {
        progress.set_message(format!("building the {nodes}-node fabric for mpirun"));
        let topo = Topology::new(shape_for(nodes));
        learn_hosts(&topo);
        let _daemons = daemons_on(&topo, &[]);
        for &(_, ppn) in sweep.shapes.iter().filter(|s| s.0 == nodes) {
            for (k, &flavour) in sweep.flavours.iter().enumerate() {
                let mut these = vec![];
                for variant in [Variant::Plain, Variant::Innet] {
                    progress.set_message(format!(
                        "osu_allreduce, {nodes} nodes × {ppn}, {} {}",
                        flavour.name(),
                        variant.name()
                    ));
                    these.extend(run_one(
                        &topo,
                        sweep,
                        (nodes, ppn),
                        flavour,
                        variant,
                        scratch,
                    ));
                    progress.inc(1);
                }
                if let Some(r) = rule(&these) {
                    progress.set_message(format!(
                        "osu_allreduce, {nodes} nodes × {ppn}, {} + innet, cutover at {} B",
                        flavour.name(),
                        r.network_max_bytes
                    ));
                    let v = Variant::Cutover(r);
                    these.extend(run_one(&topo, sweep, (nodes, ppn), flavour, v, scratch));
                    if k == 0 {
                        rules.push(r);
                    }
                }
                progress.inc(1);
                rows.extend(these);
            }
        }
    }
    (rows, rules)
}

/// The goodput sweep's MPI column: plain OpenMPI's float64 SUM over a fresh fabric of
/// `nodes` nodes, one rank per node, multi-node launch, as goodput rows
/// (`iterations` timed allreduces per size; a failed run is one row per size with its
/// error).
#[must_use]
pub fn goodput(
    nodes: usize,
    sizes: &[usize],
    iterations: usize,
    scratch: &Path,
    progress: &ProgressBar,
) -> Vec<LatencyRow> {
    progress.set_message(format!(
        "osu_allreduce -f, {nodes} nodes, OpenMPI multi-node"
    ));
    let topo = Topology::new(shape_for(nodes));
    learn_hosts(&topo);
    let sweep = MpiSweep {
        flavours: vec![Flavour::OpenMpi],
        shapes: vec![(nodes, 1)],
        sizes: sizes.to_vec(),
        // osu_allreduce times a tenth of -i beyond 8 KiB.
        iterations: iterations * 10,
        float64: true,
    };
    let rows = run_one(
        &topo,
        &sweep,
        (nodes, 1),
        Flavour::OpenMpi,
        Variant::Plain,
        &scratch.join("goodput"),
    );
    progress.inc(1);
    let row = |bytes: usize, r: &MpiRow| LatencyRow {
        mode: GOODPUT_MPI_MODE.into(),
        path: "MPI multi-node (TCP)".into(),
        dtype: "float64".into(),
        nodes,
        ppn: 1,
        ranks: nodes,
        bytes,
        iterations: r.iterations,
        avg_us: r.avg_us,
        // osu_allreduce reports the ranks' mean, least and largest averages.
        p50_us: r.avg_us,
        p99_us: r.max_us,
        errors: r.errors,
        fallbacks: 0,
        retransmissions: 0,
        failed: (r.errors > 0).then(|| "mpirun failed (see the run's output)".into()),
        mtu: crate::bench::STANDARD_MTU,
        window: None,
    };
    match rows.as_slice() {
        [failed] if failed.errors > 0 => sizes.iter().map(|&b| row(b, failed)).collect(),
        _ => rows.iter().map(|r| row(r.bytes, r)).collect(),
    }
}

/// The goodput table's name for plain OpenMPI over the fabric.
pub const GOODPUT_MPI_MODE: &str = "openmpi";

/// Writes a cutover table of `rule` alone into `dir`; returns its path.
fn write_rule(dir: &Path, rule: Cutover) -> std::path::PathBuf {
    let table = CutoverTable {
        library: vec![],
        mpi: vec![rule],
    };
    let path = dir.join("cutover.toml");
    std::fs::write(&path, table.to_toml("this run's rule")).expect("the cutover table");
    path
}

/// What runs beside plain MPI.
#[derive(Clone, Copy)]
enum Variant {
    Plain,
    Innet,
    /// With the interposer, reading this rule.
    Cutover(Cutover),
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Self::Plain => "MPI",
            Self::Innet => "+ innet",
            Self::Cutover(_) => CUTOVER_RUN,
        }
    }

    /// Its scratch directory's suffix.
    fn tag(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::Innet => "innet",
            Self::Cutover(_) => "cutover",
        }
    }
}

fn run_one(
    topo: &Topology,
    sweep: &MpiSweep,
    (nodes, ppn): (usize, usize),
    flavour: Flavour,
    variant: Variant,
    scratch: &Path,
) -> Vec<MpiRow> {
    let ranks = nodes * ppn;
    let innet = !matches!(variant, Variant::Plain);
    let dir = scratch.join(format!(
        "{}-{nodes}x{ppn}-{}",
        flavour.name(),
        variant.tag()
    ));
    let reports_dir = dir.join("reports");
    std::fs::create_dir_all(&reports_dir).expect("the MPI scratch directory");
    let program = osu_allreduce(flavour, sweep.iterations, sweep.float64, &sweep.sizes);
    let mut mpirun = MpiRun::new(flavour, ranks, &program).multi_node(Nodes::even(topo, ppn));
    mpirun = if innet {
        mpirun.innet(topo, ppn, &dir, &reports_dir)
    } else {
        mpirun.without_interposer()
    };
    if !PLACEMENT_FILE {
        mpirun = mpirun.without_placement_file();
    }
    match variant {
        // innet alone: the rule below is derived from it, so no calls handed to MPI to
        // learn a cutover.
        Variant::Innet => mpirun = mpirun.env(LEARN_VAR, "0"),
        Variant::Cutover(rule) => mpirun = mpirun.env(CUTOVER_VAR, write_rule(&dir, rule)),
        Variant::Plain => {}
    }
    let out = mpirun.output().expect("spawn mpirun");
    // What every row of this run shares; a failed run is this row alone, marked.
    let run = MpiRow {
        flavour: flavour.name().into(),
        innet,
        cutover: matches!(variant, Variant::Cutover(_)),
        transport: "fabric".into(),
        launch: mpirun.launch.name().into(),
        settings: mpirun.settings(),
        placement_file: innet && mpirun.placement_file,
        nodes,
        ppn,
        ranks,
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
            "osu_allreduce ({}, {nodes}x{ppn}, {}) failed: {why}",
            flavour.name(),
            variant.name()
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
        let all = reports(&reports_dir, ranks);
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

/// Plain `osu_allreduce` under OpenMPI over `topo`, multi-node launch (`ppn` ranks on each
/// node): average µs per size, `iterations` timed calls each,
/// int32 SUM or (`float64`) float64 SUM. What a user runs instead of innet.
///
/// # Errors
/// mpirun failed, or reported another number of sizes.
pub fn plain_openmpi(
    topo: &Topology,
    (nodes, ppn): (usize, usize),
    sizes: &[usize],
    iterations: usize,
    float64: bool,
) -> Result<Vec<(usize, f64)>, String> {
    let flavour = Flavour::OpenMpi;
    let program = osu_allreduce(flavour, iterations, float64, sizes);
    let out = MpiRun::new(flavour, nodes * ppn, &program)
        .multi_node(Nodes::uneven(topo, &vec![ppn; nodes]))
        .without_interposer()
        .output()
        .map_err(|e| format!("spawning mpirun: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let rows: Vec<(usize, f64)> = parse(&String::from_utf8_lossy(&out.stdout))
        .into_iter()
        .map(|(bytes, avg, ..)| (bytes, avg))
        .collect();
    if rows.len() != sizes.len() {
        return Err(format!("{} of {} sizes reported", rows.len(), sizes.len()));
    }
    Ok(rows)
}

/// `osu_allreduce` of `flavour` with `iterations` timed calls (a tenth, at least 10, of
/// warm-up), float64 or int32 SUM, at `sizes`.
fn osu_allreduce(
    flavour: Flavour,
    iterations: usize,
    float64: bool,
    sizes: &[usize],
) -> Vec<OsString> {
    let mut program: Vec<OsString> = vec![
        flavour.program("osu_allreduce").into(),
        "-i".into(),
        iterations.to_string().into(),
        "-w".into(),
        (iterations / 10).max(10).to_string().into(),
    ];
    if float64 {
        program.push("-f".into());
    }
    program.extend(sizes.iter().map(|b| b.to_string().into()));
    program
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
