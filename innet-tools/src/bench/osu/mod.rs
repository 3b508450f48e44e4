//! The real OSU micro-benchmarks (built from OSU's source by `cargo xtask osu`) under the
//! multi-node launch, plain MPI and MPI with innet's interposer as a user switches it on
//! (learned cutover), side by side in the same run: issue 34's targets are stated with
//! them.
//!
//! Per shape, flavour and benchmark three runs: plain MPI, + innet, plain MPI again (the
//! MPI column is the mean of the two, so drift between runs favours neither side), after
//! an unreported warm-up run per fabric and shape. Each
//! row is one size with both sides' OSU columns, the ratio MPI µs / innet µs (pure
//! communication latency for the non-blocking benchmarks), what the interposer served of
//! the benchmark's collective, and the target it is held to ([`target`]).

pub mod parse;
pub mod tables;
pub mod target;

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
};

use indicatif::ProgressBar;
use innet_mpi::{kind::NAMES as KINDS, rank_report::Summary};
use serde::{Deserialize, Serialize};

pub use self::parse::Times;
use super::mpi::{is_cutover_pass, launch, learned_way_of, on_fabrics};
use innet_lab::{
    mpi::{Flavour, reports},
    topology::Topology,
};

/// OSU's point-to-point benchmarks the sweep knows: they make no collective innet serves,
/// so they show what innet in the process costs MPI's own traffic. They run once, on two
/// nodes of the first shape's fabric, one rank each (TCP across the bridges).
pub const POINT_TO_POINT: [&str; 2] = ["latency", "bw"];
/// Their shape: two nodes, one rank each.
pub const POINT_TO_POINT_SHAPE: (usize, usize) = (2, 1);

/// Whether `test` is one of OSU's point-to-point benchmarks.
#[must_use]
pub fn point_to_point(test: &str) -> bool {
    POINT_TO_POINT.contains(&test)
}

/// Whether `test` takes message sizes (`-m`): every benchmark but the barriers.
#[must_use]
pub fn sized(test: &str) -> bool {
    !matches!(test, "barrier" | "ibarrier")
}

/// What to run.
#[derive(Clone, Debug)]
pub struct OsuSweep {
    /// Where `cargo xtask osu` put the binaries: `<dir>/<flavour>/osu_<test>`.
    pub dir: PathBuf,
    pub flavours: Vec<Flavour>,
    /// Benchmarks without `osu_` (`iallreduce`, `allgather` …).
    pub tests: Vec<String>,
    /// (nodes, ranks per node) of each job.
    pub shapes: Vec<(usize, usize)>,
    /// OSU's `-m MIN:MAX` (powers of two from MIN).
    pub sizes: (usize, usize),
    /// OSU's `-i` and `-x`.
    pub iterations: usize,
    pub warmup: usize,
    /// OSU's `-c` (validation, untimed; with `-u 0`): results checked.
    pub validate: bool,
}

impl OsuSweep {
    /// Progress steps: one per mpirun.
    #[must_use]
    pub fn steps(&self) -> u64 {
        let point_to_point = self.tests.iter().filter(|t| point_to_point(t)).count();
        let collective = self.tests.len() - point_to_point;
        let jobs = collective * self.shapes.len() + point_to_point;
        (VARIANTS.len() * self.flavours.len() * jobs) as u64
    }

    /// The shape `test` runs at on the fabric of `shape` (`None`: not there).
    fn shape_of(&self, test: &str, shape: (usize, usize)) -> Option<(usize, usize)> {
        if !point_to_point(test) {
            return Some(shape);
        }
        (self.shapes.first() == Some(&shape)).then_some(POINT_TO_POINT_SHAPE)
    }

    /// Every benchmark is built, and is one the interposer's reports count.
    ///
    /// # Errors
    /// A missing binary (with how to build it) or an unknown benchmark.
    pub fn check(&self) -> Result<(), String> {
        if self.tests.iter().any(|t| point_to_point(t))
            && self.shapes.first().is_none_or(|&(nodes, _)| nodes < 2)
        {
            return Err(
                "the point-to-point benchmarks run on two nodes of the first \
                        shape's fabric: make the first --osu-shapes entry at least 2 nodes"
                    .into(),
            );
        }
        for t in &self.tests {
            if !KINDS.contains(&t.as_str()) && !point_to_point(t) {
                return Err(format!(
                    "osu_{t}: not a collective innet's interposer counts ({}) nor a \
                     point-to-point benchmark the bench knows ({})",
                    KINDS.join(", "),
                    POINT_TO_POINT.join(", ")
                ));
            }
            for f in &self.flavours {
                let bin = self.binary(*f, t);
                if !bin.is_file() {
                    return Err(format!(
                        "{} is missing: build it with `cargo xtask osu --source OSU_SOURCE \
                         --flavours {} --tests {t}`",
                        bin.display(),
                        f.name()
                    ));
                }
            }
        }
        if self.sizes.0 == 0 || self.sizes.0 > self.sizes.1 {
            return Err(format!(
                "sizes {}:{}: need 0 < MIN ≤ MAX",
                self.sizes.0, self.sizes.1
            ));
        }
        Ok(())
    }

    fn binary(&self, flavour: Flavour, test: &str) -> PathBuf {
        self.dir.join(flavour.name()).join(format!("osu_{test}"))
    }

    /// OSU's command line for `test`.
    fn program(&self, flavour: Flavour, test: &str) -> Vec<OsString> {
        let collective = !point_to_point(test);
        let mut p: Vec<OsString> = vec![self.binary(flavour, test).into()];
        if collective {
            p.push("-f".into()); // full: min, max, iterations (collectives only)
        }
        let sized = sized(test);
        if sized {
            p.extend([
                "-m".into(),
                format!("{}:{}", self.sizes.0, self.sizes.1).into(),
            ]);
        }
        if sized && collective {
            // int32, as innet's allreduce rows: reductions of MPI_CHAR are no user's case.
            p.extend(["-T".into(), "mpi_int".into()]);
        }
        if collective {
            // OSU's `-i` sets every size's iterations; the point-to-point ones keep OSU's
            // own (10,000 small, 1,000 large for latency; 100 and 20 windows for bw).
            p.extend(["-i".into(), self.iterations.to_string().into()]);
            p.extend(["-x".into(), self.warmup.to_string().into()]);
        }
        if self.validate && sized && collective {
            p.extend(["-c".into(), "-u".into(), "0".into()]);
        }
        p
    }

    /// Calls of `test`'s collective each rank makes in a run: warm-up and timed
    /// iterations per size, twice for a non-blocking benchmark (pure, then overlapped).
    #[must_use]
    pub fn calls(&self, test: &str, sizes: usize) -> u64 {
        if point_to_point(test) {
            return 0;
        }
        let phases = if test.starts_with('i') { 2 } else { 1 };
        ((self.iterations + self.warmup) * sizes * phases) as u64
    }
}

/// One size of one benchmark at one shape: plain MPI and MPI + innet side by side.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OsuRow {
    /// The benchmark without `osu_` (also the interposer's kind for its collective).
    pub test: String,
    pub flavour: String,
    /// OSU's version, from its title line.
    pub osu_version: String,
    pub nodes: usize,
    pub ppn: usize,
    /// 0 for `ibarrier`.
    pub bytes: usize,
    /// How mpirun started the ranks (`multi-node`) and the settings that shape the
    /// measurement.
    pub launch: String,
    pub settings: String,
    /// Plain MPI before and after the interposed run; innet's run.
    pub mpi: Option<Times>,
    pub mpi_again: Option<Times>,
    pub innet: Option<Times>,
    /// The mean of the plain runs' latency (µs).
    pub mpi_us: Option<f64>,
    /// MPI µs / innet µs (above 1: innet is faster).
    pub ratio: Option<f64>,
    /// The innet run, all sizes: the benchmark's collective as rank 0's interposer saw
    /// it: served by innet, passed to MPI (`cutover`: by the learned cutover), and the
    /// calls OSU made per rank.
    pub served: u64,
    pub passed: u64,
    pub to_mpi: u64,
    pub calls: u64,
    /// All ranks' collectives that fell back to the hosts after the network failed them.
    pub fallbacks: u64,
    /// The way rank 0's learned cutover took for this size's class (`network`, `mpi`).
    pub way: Option<String>,
    /// The issue-34 target this row is held to, and whether it is met.
    pub target: Option<String>,
    pub met: Option<bool>,
    /// Runs that failed (which and why).
    #[serde(default)]
    pub failed: Vec<String>,
}

impl OsuRow {
    /// Whether OSU's validation failed on either side.
    #[must_use]
    pub fn wrong(&self) -> bool {
        [&self.mpi, &self.mpi_again, &self.innet]
            .into_iter()
            .flatten()
            .any(|t| t.valid == Some(false))
    }
}

/// The runs per benchmark, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Plain,
    Innet,
    PlainAgain,
}

const VARIANTS: [Variant; 3] = [Variant::Plain, Variant::Innet, Variant::PlainAgain];

impl Variant {
    const fn name(self) -> &'static str {
        match self {
            Self::Plain => "MPI",
            Self::Innet => "+ innet",
            Self::PlainAgain => "MPI, again",
        }
    }

    const fn tag(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::Innet => "innet",
            Self::PlainAgain => "plain-again",
        }
    }
}

/// One mpirun's outcome: OSU's output, and with the interposer every rank's report.
struct Run {
    output: parse::Output,
    reports: Vec<Summary>,
}

/// Runs the sweep, a fresh fabric per node count.
#[must_use]
pub fn run(sweep: &OsuSweep, scratch: &Path, progress: &ProgressBar) -> Vec<OsuRow> {
    on_fabrics(
        (&sweep.shapes, None),
        "OSU",
        progress,
        |topo, (nodes, ppn)| {
            let mut rows = vec![];
            warm_up(topo, sweep, (nodes, ppn), &scratch.join("warm-up"));
            for &flavour in &sweep.flavours {
                for test in &sweep.tests {
                    let Some((nodes, ppn)) = sweep.shape_of(test, (nodes, ppn)) else {
                        continue;
                    };
                    let mut runs = vec![];
                    for variant in VARIANTS {
                        progress.set_message(format!(
                            "osu_{test}, {nodes} nodes × {ppn}, {} {}",
                            flavour.name(),
                            variant.name()
                        ));
                        let job = Job {
                            topo,
                            sweep,
                            shape: (nodes, ppn),
                            flavour,
                            test,
                        };
                        runs.push(job.run(variant, scratch));
                        progress.inc(1);
                    }
                    let settings = launch(topo, flavour, (nodes * ppn, ppn), &[], None);
                    rows.extend(merge(
                        sweep,
                        test,
                        flavour,
                        (nodes, ppn),
                        (settings.launch.name(), &settings.settings()),
                        &runs,
                    ));
                }
            }
            rows
        },
    )
}

/// An unreported plain run of the first benchmark at the smallest size on a fresh fabric
/// and shape: the first mpirun there measured 2–5 ms a call at its first size where the
/// runs after it measured 60–100 µs (4 × 1), which would weigh on the first MPI column.
fn warm_up(topo: &Topology, sweep: &OsuSweep, shape: (usize, usize), scratch: &Path) {
    let first_collective = sweep.tests.iter().find(|t| !point_to_point(t));
    let (Some(test), Some(&flavour)) = (first_collective, sweep.flavours.first()) else {
        return;
    };
    let short = OsuSweep {
        sizes: (sweep.sizes.0, sweep.sizes.0),
        iterations: 50,
        warmup: 10,
        validate: false,
        ..sweep.clone()
    };
    let job = Job {
        topo,
        sweep: &short,
        shape,
        flavour,
        test,
    };
    match job.run(Variant::Plain, scratch) {
        Ok(r) => tracing::info!(
            "warm-up osu_{test}: {:?} µs",
            r.output.rows.first().map(|t| t.latency_us)
        ),
        Err(e) => tracing::warn!("warm-up osu_{test}: {e}"),
    }
}

/// One benchmark at one shape.
struct Job<'a> {
    topo: &'a Topology,
    sweep: &'a OsuSweep,
    shape: (usize, usize),
    flavour: Flavour,
    test: &'a str,
}

impl Job<'_> {
    fn run(&self, variant: Variant, scratch: &Path) -> Result<Run, String> {
        let (nodes, ppn) = self.shape;
        let ranks = nodes * ppn;
        let dir = scratch.join(format!(
            "{}-{}-{nodes}x{ppn}-{}",
            self.test,
            self.flavour.name(),
            variant.tag()
        ));
        let reports_dir = dir.join("reports");
        std::fs::create_dir_all(&reports_dir)
            .map_err(|e| format!("creating {}: {e}", reports_dir.display()))?;
        let innet = variant == Variant::Innet;
        let program = self.sweep.program(self.flavour, self.test);
        let mpirun = launch(
            self.topo,
            self.flavour,
            (ranks, ppn),
            &program,
            innet.then_some(reports_dir.as_path()),
        );
        let out = mpirun
            .output()
            .map_err(|e| format!("{}: spawning mpirun: {e}", variant.name()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        // Kept for whoever reads the run afterwards (and for new parser test data).
        let _ = std::fs::write(dir.join("stdout.txt"), stdout.as_bytes());
        let _ = std::fs::write(dir.join("stderr.txt"), &out.stderr);
        let why = |what: String| {
            let why = format!("{}: {what}", variant.name());
            tracing::error!(test = self.test, nodes, ppn, "osu run failed: {why}");
            why
        };
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
            return Err(why(format!(
                "mpirun {}: {}",
                out.status,
                tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
            )));
        }
        let output = parse::parse(&stdout).map_err(|e| why(e.to_string()))?;
        let reports = if innet {
            std::panic::catch_unwind(|| reports(&reports_dir, ranks)).map_err(|_| {
                why(format!(
                    "not every rank wrote its report into {}",
                    reports_dir.display()
                ))
            })?
        } else {
            vec![]
        };
        Ok(Run { output, reports })
    }
}

/// The rows of one benchmark at one shape from its three runs (in [`VARIANTS`]' order).
fn merge(
    sweep: &OsuSweep,
    test: &str,
    flavour: Flavour,
    (nodes, ppn): (usize, usize),
    (launch, settings): (&str, &str),
    runs: &[Result<Run, String>],
) -> Vec<OsuRow> {
    let times = |k: usize, bytes: usize| {
        runs[k]
            .as_ref()
            .ok()
            .and_then(|r| r.output.rows.iter().find(|t| t.bytes == bytes).cloned())
    };
    let mut sizes: Vec<usize> = runs
        .iter()
        .flatten()
        .flat_map(|r| r.output.rows.iter().map(|t| t.bytes))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let failed: Vec<String> = runs
        .iter()
        .filter_map(|r| r.as_ref().err().cloned())
        .collect();
    if sizes.is_empty() {
        // Nothing measured: one row says so.
        sizes.push(sweep.sizes.0);
    }
    let version = runs
        .iter()
        .flatten()
        .find_map(|r| r.output.version().map(str::to_owned))
        .unwrap_or_default();
    let reports: &[Summary] = runs[1].as_ref().map_or(&[], |r| &r.reports);
    let (served, passed, to_mpi) = kind_counts(reports, test);
    let measured = runs[1].as_ref().map_or(0, |r| r.output.rows.len());
    sizes
        .into_iter()
        .map(|bytes| {
            let (mpi, innet, mpi_again) = (times(0, bytes), times(1, bytes), times(2, bytes));
            let plain: Vec<f64> = [&mpi, &mpi_again]
                .into_iter()
                .flatten()
                .map(|t| t.latency_us)
                .collect();
            let mpi_us =
                (!plain.is_empty()).then(|| plain.iter().sum::<f64>() / plain.len() as f64);
            let ratio = mpi_us.zip(innet.as_ref()).map(|(m, i)| m / i.latency_us);
            let mut row = OsuRow {
                test: test.into(),
                flavour: flavour.name().into(),
                osu_version: version.clone(),
                nodes,
                ppn,
                bytes,
                launch: launch.into(),
                settings: settings.into(),
                mpi,
                mpi_again,
                innet,
                mpi_us,
                ratio,
                served,
                passed,
                to_mpi,
                calls: sweep.calls(test, measured),
                fallbacks: reports.iter().map(|r| r.fallbacks).sum(),
                way: reports.first().and_then(|r| learned_way_of(r, test, bytes)),
                target: None,
                met: None,
                failed: failed.clone(),
            };
            (row.target, row.met) = target::check(&row);
            row
        })
        .collect()
}

/// Rank 0's calls of `kind`: served by innet, passed to MPI (all reasons), and of those
/// the ones the cutover gave MPI.
fn kind_counts(reports: &[Summary], kind: &str) -> (u64, u64, u64) {
    let Some(first) = reports.first() else {
        return (0, 0, 0);
    };
    let prefix = format!("{kind}/");
    let of_kind = || first.passed.iter().filter(|(k, _)| k.starts_with(&prefix));
    (
        first.served(kind),
        of_kind().map(|(_, n)| n).sum(),
        of_kind()
            .filter(|(k, _)| is_cutover_pass(k))
            .map(|(_, n)| n)
            .sum(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sweep() -> OsuSweep {
        OsuSweep {
            dir: "/osu".into(),
            flavours: vec![Flavour::OpenMpi],
            tests: vec!["iallreduce".into(), "ibarrier".into()],
            shapes: vec![(4, 1)],
            sizes: (4, 256),
            iterations: 100,
            warmup: 10,
            validate: true,
        }
    }

    #[test]
    fn command_lines_follow_osu_options() {
        let s = sweep();
        let words = |t| {
            s.program(Flavour::OpenMpi, t)
                .iter()
                .map(|w| w.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(
            words("iallreduce"),
            "/osu/openmpi/osu_iallreduce -f -m 4:256 -T mpi_int -i 100 -x 10 -c -u 0"
        );
        // osu_ibarrier has no sizes, no type and no validation.
        assert_eq!(
            words("ibarrier"),
            "/osu/openmpi/osu_ibarrier -f -i 100 -x 10"
        );
        // 7 sizes × 110 calls, twice (pure and overlapped) for a non-blocking benchmark.
        assert_eq!(s.calls("iallreduce", 7), 1540);
        assert_eq!(s.calls("allgather", 7), 770);
        assert_eq!(s.steps(), 6);
    }

    #[test]
    fn point_to_point_runs_once_on_two_nodes_with_osus_own_iterations() {
        let s = OsuSweep {
            tests: vec!["allgather".into(), "latency".into(), "bw".into()],
            shapes: vec![(4, 1), (16, 1)],
            ..sweep()
        };
        let words = s
            .program(Flavour::OpenMpi, "latency")
            .iter()
            .map(|w| w.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        assert_eq!(words, "/osu/openmpi/osu_latency -m 4:256");
        assert_eq!(s.shape_of("latency", (4, 1)), Some(POINT_TO_POINT_SHAPE));
        assert_eq!(s.shape_of("bw", (16, 1)), None);
        assert_eq!(s.shape_of("allgather", (16, 1)), Some((16, 1)));
        // allgather at two shapes, latency and bw once each: 4 jobs of 3 runs.
        assert_eq!(s.steps(), 12);
        assert_eq!(s.calls("bw", 7), 0);
        let one_node = OsuSweep {
            shapes: vec![(1, 4)],
            ..s
        };
        assert!(one_node.check().unwrap_err().contains("at least 2 nodes"));
    }

    #[test]
    fn rows_pair_both_sides_and_count_the_benchmarks_collective() {
        let s = sweep();
        let out = |text: &str| {
            Ok(Run {
                output: parse::parse(text).unwrap(),
                reports: vec![],
            })
        };
        let a = include_str!("testdata/iallreduce.txt");
        let mut innet = out(a);
        if let Ok(r) = &mut innet {
            let mut report: Summary = serde_json::from_str(
                r#"{"rank":0,"served":{"iallreduce":1000},"passed":{"iallreduce/learning":40,
                "iallreduce/cutover":500,"allreduce/op":3},"network":1000,"nic_tree":0,"host":0,
                "local":0,"fallbacks":2,"retransmissions":0,"groups_opened":1,
                "groups_refused":0,"groups_closed":1}"#,
            )
            .unwrap();
            r.reports.push(report);
            report = serde_json::from_str(&serde_json::to_string(&r.reports[0]).unwrap()).unwrap();
            report.rank = 1;
            r.reports.push(report);
            // innet twice as fast as MPI at every size.
            for t in &mut r.output.rows {
                t.latency_us /= 2.0;
            }
        }
        let runs = vec![
            out(a),
            innet,
            Err("MPI, again: mpirun exit status: 1".into()),
        ];
        let rows = merge(
            &s,
            "iallreduce",
            Flavour::OpenMpi,
            (4, 1),
            ("multi-node", "x"),
            &runs,
        );
        assert_eq!(rows.len(), 7);
        let r = &rows[0];
        assert_eq!((r.bytes, r.osu_version.as_str()), (4, "7.4"));
        assert_eq!(r.mpi_us, Some(4.33));
        assert!((r.ratio.unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(
            (r.served, r.passed, r.to_mpi, r.fallbacks),
            (1000, 540, 540, 4)
        );
        assert_eq!(r.calls, 7 * 110 * 2);
        assert_eq!(r.failed, ["MPI, again: mpirun exit status: 1"]);
        assert!(r.mpi_again.is_none());
        // 2× but OSU's overlap 0 %: the non-blocking target is missed.
        assert_eq!(r.met, Some(false));
    }
}
