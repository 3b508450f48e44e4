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
    Cutover,
    cutover::{self, Measured},
};
use innet_mpi::session::LEARN_VAR;
use serde::{Deserialize, Serialize};

use super::{
    LatencyRow, STANDARD_MTU,
    cpu::Snapshot,
    latency::{Sweep, shape_for},
};
use innet_lab::{
    daemons::{daemons_on, learn_hosts},
    mpi::{Flavour, MpiRun, Nodes, reports},
    shaping::{LinkMeter, LinkRate},
    topology::{Options, Topology},
};

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
    /// Every link of its fabrics shaped to this rate, both ways (`None`: the CPUs bind).
    pub link_rate: Option<LinkRate>,
}

impl MpiSweep {
    /// Progress steps: one per mpirun.
    #[must_use]
    pub fn steps(&self) -> u64 {
        4 * (self.flavours.len() * self.shapes.len()) as u64
    }
}

/// One size of one run: osu_allreduce's columns, and what the interposer did.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "a serialized row: older runs' JSON keeps its flags readable"
)]
pub struct MpiRow {
    /// `openmpi` or `mpich`.
    pub flavour: String,
    /// Whether innet's interposer was preloaded.
    pub innet: bool,
    /// With the interposer: whether it read a cutover table (runs before the learned
    /// cutover: sizes the table gives MPI go to MPI).
    #[serde(default)]
    pub cutover: bool,
    /// With the interposer: whether it learned its cutover (nothing set but the preload:
    /// what a user gets); else it served every size (`INNET_MPI_LEARN=0`).
    #[serde(default)]
    pub learned: bool,
    /// The learned run: the way rank 0's interposer took for this size's allreduces at
    /// the end (`network` or `mpi`).
    #[serde(default)]
    pub way: Option<String>,
    /// The learned run: rank 0's calls the cutover gave MPI (its trials' and its decisions').
    #[serde(default)]
    pub to_mpi: u64,
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
    /// Calls that fell back to the hosts, or were passed to MPI for another reason than
    /// the cutover, with the interposer (all ranks).
    pub fallbacks: u64,
    /// Plain MPI run again after the interposed runs of its shape (the MPI column is the
    /// mean of the two, so drift between runs cancels instead of favouring either side).
    #[serde(default)]
    pub again: bool,
    /// 1 when the run failed (a wrong result aborts it): no numbers then.
    pub errors: usize,
}

impl MpiRow {
    /// Which of a shape's runs this row belongs to, as the report names it.
    #[must_use]
    pub fn run_name(&self) -> &'static str {
        match (self.innet, self.learned, self.cutover) {
            (false, ..) if self.again => Variant::PlainAgain.name(),
            (false, ..) => Variant::Plain.name(),
            (true, true, _) => Variant::Learned.name(),
            (true, false, true) => CUTOVER_RUN,
            (true, false, false) => Variant::Alone.name(),
        }
    }

    /// innet serving every size (no learning, no table).
    #[must_use]
    pub fn is_alone(&self) -> bool {
        self.innet && !self.learned && !self.cutover
    }
}

/// The name of runs with a cutover table (earlier runs).
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

/// Plain MPI's time for `like`'s flavour, shape and size: the mean of the plain runs
/// before and after the interposed ones (µs), or `None` when none finished.
#[must_use]
pub fn plain_us(rows: &[MpiRow], like: &MpiRow) -> Option<f64> {
    let times: Vec<f64> = rows
        .iter()
        .filter(|p| {
            !p.innet
                && p.errors == 0
                && (p.flavour.as_str(), p.nodes, p.ppn, p.bytes)
                    == (like.flavour.as_str(), like.nodes, like.ppn, like.bytes)
        })
        .map(|p| p.avg_us)
        .collect();
    (!times.is_empty()).then(|| times.iter().sum::<f64>() / times.len() as f64)
}

/// The cutover rule `rows` call for (one flavour and shape): innet's sizes up to the first
/// one MPI over the fabric is faster for.
#[must_use]
pub fn rule(rows: &[MpiRow]) -> Option<Cutover> {
    let points: Vec<Measured> = rows
        .iter()
        .filter(|r| r.is_alone() && r.errors == 0)
        .filter_map(|i| {
            Some(Measured {
                nodes: i.nodes,
                ppn: i.ppn,
                bytes: i.bytes,
                network_us: i.avg_us,
                host_us: plain_us(rows, i)?,
            })
        })
        .collect();
    cutover::derive(&points).into_iter().next()
}

/// Runs the sweep, a fresh fabric per node count; a failed run becomes one row with
/// `errors` set. Per shape and flavour: plain MPI, MPI with the interposer as a user
/// switches it on (no placement file, the learned cutover), and with the interposer
/// serving every size. Returns the rows and the cutover table's rules the plain and
/// innet-alone runs call for (the first flavour's).
#[must_use]
pub fn run(
    sweep: &MpiSweep,
    scratch: &Path,
    progress: &ProgressBar,
) -> (Vec<MpiRow>, Vec<Cutover>) {
    let mut rules = vec![];
    let fabrics = (sweep.shapes.as_slice(), sweep.link_rate);
    let rows = on_fabrics(fabrics, "mpirun", progress, |topo, (nodes, ppn)| {
        let mut rows = vec![];
        for (k, &flavour) in sweep.flavours.iter().enumerate() {
            let mut these = vec![];
            // Plain MPI before and after: the runs drift a few percent over minutes.
            for variant in [
                Variant::Plain,
                Variant::Learned,
                Variant::Alone,
                Variant::PlainAgain,
            ] {
                progress.set_message(format!(
                    "osu_allreduce, {nodes} nodes × {ppn}, {} {}",
                    flavour.name(),
                    variant.name()
                ));
                these.extend(run_one(
                    topo,
                    sweep,
                    (nodes, ppn),
                    flavour,
                    variant,
                    scratch,
                ));
                progress.inc(1);
            }
            if let Some(r) = rule(&these)
                && k == 0
            {
                rules.push(r);
            }
            rows.extend(these);
        }
        rows
    });
    (rows, rules)
}

/// Runs `each` for every (nodes, ranks per node) of `shapes`, on a fresh fabric per node
/// count (in increasing order, every switch with its daemon, every link shaped to
/// `link_rate` when given): what every mpirun section of the bench does. `what` names the
/// runs in the progress bar.
pub fn on_fabrics<T>(
    (shapes, link_rate): (&[(usize, usize)], Option<LinkRate>),
    what: &str,
    progress: &ProgressBar,
    mut each: impl FnMut(&Topology, (usize, usize)) -> Vec<T>,
) -> Vec<T> {
    let mut rows = vec![];
    let mut node_counts: Vec<usize> = shapes.iter().map(|s| s.0).collect();
    node_counts.sort_unstable();
    node_counts.dedup();
    for nodes in node_counts {
        progress.set_message(format!("building the {nodes}-node fabric for {what}"));
        let topo = Topology::with(
            shape_for(nodes),
            Options {
                innet: true,
                link_rate,
                ..Options::default()
            },
        );
        learn_hosts(&topo);
        let _daemons = daemons_on(&topo, &[]);
        for &(_, ppn) in shapes.iter().filter(|s| s.0 == nodes) {
            rows.extend(each(&topo, (nodes, ppn)));
        }
    }
    rows
}

/// The goodput sweep's MPI column: plain OpenMPI's float64 SUM over a fresh fabric of
/// `nodes` nodes built like `like`'s (its depth, its links' MTU and rate, innet on the
/// switches), one rank per node, multi-node launch, as goodput rows at `like`'s sizes (its
/// `iterations` timed allreduces per size; a failed run is a row with its error). One
/// mpirun per size, each with the machine's busy CPU over the whole launch (OSU's warm-up
/// included), so a reader sees whether the CPUs or the links bound it.
///
/// # Panics
/// The fabric cannot hold `nodes` nodes (the bench checks its fabrics first).
#[must_use]
pub fn goodput(
    like: &Sweep,
    nodes: usize,
    scratch: &Path,
    progress: &ProgressBar,
) -> Vec<LatencyRow> {
    let mtu = like.mtu.unwrap_or(STANDARD_MTU);
    progress.set_message(format!(
        "osu_allreduce -f, {nodes} nodes, MTU {mtu}, OpenMPI multi-node"
    ));
    let shape = like.fabric.shape(nodes).unwrap_or_else(|e| panic!("{e}"));
    let options = Options {
        innet: true,
        mtu: like.mtu,
        link_rate: like.link_rate,
        ..Options::default()
    };
    let topo = Topology::with(shape, options);
    learn_hosts(&topo);
    let mut out = vec![];
    for &bytes in &like.sizes {
        let sweep = MpiSweep {
            flavours: vec![Flavour::OpenMpi],
            shapes: vec![(nodes, 1)],
            sizes: vec![bytes],
            // osu_allreduce times a tenth of -i beyond 8 KiB.
            iterations: like.iterations * 10,
            float64: true,
            link_rate: like.link_rate,
        };
        let before = Snapshot::take(false);
        let meter = topo.wires.as_ref().map(|w| LinkMeter::start(&w.ns));
        let rows = run_one(
            &topo,
            &sweep,
            (nodes, 1),
            Flavour::OpenMpi,
            Variant::Plain,
            &scratch.join(format!("goodput-{nodes}-nodes-mtu-{mtu}-{bytes}-bytes")),
        );
        let cpu = before.cost(rows.first().map_or(0, |r| r.iterations));
        let link = meter
            .zip(like.link_rate)
            .and_then(|(m, rate)| m.busiest(rate));
        let row = |r: &MpiRow| LatencyRow {
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
            mtu,
            link_bps: like.link_rate.map(|r| r.0),
            // Its fabric drops nothing: the wires drop INC data only, and MPI's is TCP.
            link_loss: None,
            window: None,
            levels: topo.shape.levels,
            cpu: cpu.clone(),
            link_use: link.as_ref().map(|l| l.share),
            link_drops: link.as_ref().map(|l| l.drops),
        };
        out.extend(
            rows.iter()
                .filter(|r| r.bytes == bytes || r.errors > 0)
                .map(row)
                .take(1),
        );
    }
    progress.inc(1);
    out
}

/// The goodput table's name for plain OpenMPI over the fabric.
pub const GOODPUT_MPI_MODE: &str = "openmpi";

/// What runs beside plain MPI.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    Plain,
    /// Plain MPI again, after the interposed runs.
    PlainAgain,
    /// The interposer preloaded, nothing else set: it finds the placement and learns
    /// where MPI is faster.
    Learned,
    /// The interposer serving every size (`INNET_MPI_LEARN=0`): innet's own numbers.
    Alone,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Self::Plain => "MPI",
            Self::PlainAgain => "MPI, again",
            Self::Learned => "+ innet",
            Self::Alone => "+ innet, alone",
        }
    }

    /// Its scratch directory's suffix.
    fn tag(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::PlainAgain => "plain-again",
            Self::Learned => "innet",
            Self::Alone => "alone",
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
    let innet = !matches!(variant, Variant::Plain | Variant::PlainAgain);
    let dir = scratch.join(format!(
        "{}-{nodes}x{ppn}-{}",
        flavour.name(),
        variant.tag()
    ));
    let reports_dir = dir.join("reports");
    std::fs::create_dir_all(&reports_dir).expect("the MPI scratch directory");
    let program = osu_allreduce(flavour, sweep.iterations, sweep.float64, &sweep.sizes);
    let mut mpirun = launch(
        topo,
        flavour,
        (ranks, ppn),
        &program,
        innet.then_some(reports_dir.as_path()),
    );
    if variant == Variant::Alone {
        mpirun = mpirun.env(LEARN_VAR, "0");
    }
    let out = mpirun.output().expect("spawn mpirun");
    // What every row of this run shares; a failed run is this row alone, marked.
    let run = MpiRow {
        flavour: flavour.name().into(),
        innet,
        cutover: false,
        learned: variant == Variant::Learned,
        again: variant == Variant::PlainAgain,
        way: None,
        to_mpi: 0,
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
    let all = if innet {
        reports(&reports_dir, ranks)
    } else {
        vec![]
    };
    let (served, fallbacks, to_mpi) = counts(&all);
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
            to_mpi,
            way: all.first().and_then(|r| learned_way(r, bytes)),
            ..run.clone()
        })
        .collect()
}

/// `program` under the multi-node launch over `topo`'s nodes (`ppn` ranks on each): plain
/// MPI, or with `reports`, innet's interposer preloaded with nothing else set (it finds
/// the placement and learns its cutover, as on a user's cluster) writing its reports there.
#[must_use]
pub fn launch(
    topo: &Topology,
    flavour: Flavour,
    (ranks, ppn): (usize, usize),
    program: &[OsString],
    reports: Option<&Path>,
) -> MpiRun {
    let mpirun = MpiRun::new(flavour, ranks, program).multi_node(Nodes::even(topo, ppn));
    match reports {
        Some(dir) => {
            // The interposer's settings in the bench's environment reach the ranks (e.g.
            // INNET_MPI_NONBLOCKING=0); the report and placement are the bench's own.
            let own = ["INNET_MPI_REPORT", "INNET_MPI_CONFIG"];
            std::env::vars()
                .filter(|(k, _)| k.starts_with("INNET_MPI_") && !own.contains(&k.as_str()))
                .fold(mpirun.without_placement_file(), |run, (k, v)| {
                    run.env(&k, v)
                })
                .env("INNET_MPI_REPORT", dir)
        }
        None => mpirun.without_interposer(),
    }
}

/// From the interposer's reports: rank 0's collectives through the switches, the calls
/// of all ranks passed to MPI for other reasons than the cutover or fallen back, and rank
/// 0's calls the cutover gave MPI.
fn counts(all: &[innet_mpi::rank_report::Summary]) -> (u64, u64, u64) {
    let Some(first) = all.first() else {
        return (0, 0, 0);
    };
    let passed: u64 = all
        .iter()
        .flat_map(|r| &r.passed)
        .filter(|(k, _)| !is_cutover_pass(k))
        .map(|(_, n)| n)
        .sum::<u64>()
        + all.iter().map(|r| r.fallbacks).sum::<u64>();
    let to_mpi = first
        .passed
        .iter()
        .filter(|(k, _)| is_cutover_pass(k))
        .map(|(_, n)| n)
        .sum();
    (first.network, passed, to_mpi)
}

/// A report's `passed` key the cutover accounts for (its trials and its decisions).
pub(crate) fn is_cutover_pass(key: &str) -> bool {
    key.ends_with("/learning") || key.ends_with("/cutover")
}

/// The way the last decision for `bytes`' size class of MPI_COMM_WORLD's allreduces took.
fn learned_way(r: &innet_mpi::rank_report::Summary, bytes: usize) -> Option<String> {
    learned_way_of(r, "allreduce", bytes)
}

/// The way the last decision for `bytes`' size class of MPI_COMM_WORLD's `collective`s
/// (a report's kind: `allreduce`, `iallreduce` …) took.
pub(crate) fn learned_way_of(
    r: &innet_mpi::rank_report::Summary,
    collective: &str,
    bytes: usize,
) -> Option<String> {
    let class = innet_client::policy::class_max_bytes(innet_client::policy::class_of(bytes));
    r.cutover
        .iter()
        .rev()
        .find(|d| d.communicator == 0 && d.collective == collective && d.max_bytes == class)
        .map(|d| format!("{:?}", d.way).to_lowercase())
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
#[must_use]
pub fn osu_allreduce(
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
