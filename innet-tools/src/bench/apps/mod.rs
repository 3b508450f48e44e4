//! Whole applications under the multi-node launch, with and without innet's interposer
//! (nothing set but the preload): LAMMPS (Debian's `lmp`, a Lennard-Jones liquid with
//! thermo output every step, `innet-tools/apps/lj.in`) and a Krylov solver (PETSc's CG
//! through petsc4py, `innet-tools/apps/cg.py`). Each is timed start to finish and by its own
//! loop, and its output is compared with plain MPI's.
//!
//! Per application and shape, on one fabric, the four runs of [`Run`]: a discarded warm-up,
//! plain MPI, MPI with the interposer, and plain MPI again.

pub mod tables;

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

use super::{
    mpi::{launch, on_fabrics},
    side_by_side::{Run, counts, value},
};
use innet_lab::{
    mpi::{Flavour, reports},
    topology::Topology,
};

/// An application the benchmark runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum App {
    /// LAMMPS, Lennard-Jones liquid, thermo every step.
    Lammps,
    /// PETSc's CG (Jacobi) on a 2-D Laplacian, through petsc4py.
    Cg,
}

impl App {
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Lammps => "lammps",
            Self::Cg => "petsc-cg",
        }
    }

    /// What a user installs for it (the README's test command installs both).
    #[must_use]
    pub const fn package(self) -> &'static str {
        match self {
            Self::Lammps => "lammps",
            Self::Cg => "python3-petsc4py",
        }
    }

    /// Whether this machine can run it.
    #[must_use]
    pub fn installed(self) -> bool {
        match self {
            Self::Lammps => Path::new(LMP).exists(),
            Self::Cg => std::process::Command::new(PYTHON)
                .args(["-c", "import petsc4py"])
                .envs(petsc_dir().map(|d| ("PETSC_DIR", d)))
                .output()
                .is_ok_and(|o| o.status.success()),
        }
    }

    /// Its problem at `size`, as the report names it.
    fn problem(self, size: AppSize) -> String {
        match self {
            Self::Lammps => format!(
                "{} atoms, {} steps",
                4 * size.lammps_cells.pow(3),
                size.lammps_steps
            ),
            Self::Cg => format!(
                "{0}×{0} grid, {1} iterations",
                size.cg_grid, size.cg_iterations
            ),
        }
    }

    /// Its command line at `size`.
    fn program(self, size: AppSize) -> Vec<OsString> {
        match self {
            Self::Lammps => vec![
                LMP.into(),
                "-in".into(),
                input("lj.in").into(),
                "-var".into(),
                "cells".into(),
                size.lammps_cells.to_string().into(),
                "-var".into(),
                "steps".into(),
                size.lammps_steps.to_string().into(),
                "-log".into(),
                "none".into(),
                "-nocite".into(),
            ],
            Self::Cg => vec![
                PYTHON.into(),
                input("cg.py").into(),
                size.cg_grid.to_string().into(),
                size.cg_iterations.to_string().into(),
            ],
        }
    }
}

/// Debian's LAMMPS binary (built against OpenMPI).
const LMP: &str = "/usr/bin/lmp";
/// Debian's Python, which petsc4py is installed for (not whichever `python3` is first on
/// the path).
const PYTHON: &str = "/usr/bin/python3";

/// Where Debian's PETSc is, for petsc4py's path (`/usr/lib/petsc`, the link `petsc-dev`
/// would make, is missing when only `python3-petsc4py` is installed).
fn petsc_dir() -> Option<PathBuf> {
    let linked = PathBuf::from("/usr/lib/petsc");
    if linked.exists() {
        return Some(linked);
    }
    let versions = std::fs::read_dir("/usr/lib/petscdir").ok()?;
    let mut dirs: Vec<PathBuf> = versions
        .flatten()
        .map(|v| {
            v.path()
                .join(format!("{}-linux-gnu-real", std::env::consts::ARCH))
        })
        .filter(|d| d.exists())
        .collect();
    dirs.sort();
    dirs.pop()
}

/// `innet-tools/apps/<name>`: the applications' inputs.
fn input(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("apps")
        .join(name)
}

/// How big each application's problem is.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct AppSize {
    /// fcc cells per side (4 atoms each).
    pub lammps_cells: usize,
    pub lammps_steps: usize,
    /// Grid points per side.
    pub cg_grid: usize,
    pub cg_iterations: usize,
}

impl AppSize {
    /// The full run's: 4,000 atoms for 500 steps; a 256² grid for 500 iterations.
    pub const FULL: Self = Self {
        lammps_cells: 10,
        lammps_steps: 500,
        cg_grid: 256,
        cg_iterations: 500,
    };
    /// CI's smoke run: the plumbing, in seconds.
    pub const SMOKE: Self = Self {
        lammps_cells: 5,
        lammps_steps: 50,
        cg_grid: 64,
        cg_iterations: 50,
    };
}

/// What to run.
#[derive(Clone, Debug)]
pub struct AppSweep {
    pub apps: Vec<App>,
    /// (nodes, ranks per node).
    pub shapes: Vec<(usize, usize)>,
    pub size: AppSize,
}

impl AppSweep {
    /// Progress steps: one per mpirun.
    #[must_use]
    pub fn steps(&self) -> u64 {
        (Run::ALL.len() * self.apps.len() * self.shapes.len()) as u64
    }

    /// An error naming the fix when an application is not installed.
    ///
    /// # Errors
    /// The missing packages.
    pub fn check(&self) -> Result<(), String> {
        let missing: Vec<&str> = self
            .apps
            .iter()
            .filter(|a| !a.installed())
            .map(|a| a.package())
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(format!(
            "the application runs need {}: `apt-get install --no-install-recommends {}` (the \
             README's test command installs them), or leave them out with --no-apps",
            missing.join(" and "),
            missing.join(" ")
        ))
    }
}

/// One mpirun of an application.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AppRow {
    /// [`App::name`].
    pub app: String,
    pub nodes: usize,
    pub ppn: usize,
    /// Which run: `MPI, warm-up (discarded)`, `MPI`, `+ innet`, `MPI, again`.
    pub run: String,
    /// The problem it solved (atoms and steps; grid and iterations).
    #[serde(default)]
    pub problem: String,
    pub innet: bool,
    /// Start to finish: mpirun's wall time, seconds.
    pub wall_s: f64,
    /// The application's own loop time per step or iteration, µs.
    pub per_iteration_us: f64,
    /// Steps or iterations its loop ran.
    pub iterations: u64,
    /// What must match plain MPI's: LAMMPS's thermo table; the solver's residual norm.
    pub output: String,
    /// With the interposer: collectives innet served through the network (all ranks), and
    /// those it ran on the hosts after the network failed them.
    pub served: u64,
    pub fallbacks: u64,
    /// Why the run gave no numbers.
    pub failed: Option<String>,
    /// Where its whole output is.
    pub log: String,
}

impl AppRow {
    /// Whether the run counts in its shape's means (finished, not the warm-up).
    #[must_use]
    pub fn counts(&self) -> bool {
        counts(&self.run, self.failed.is_some())
    }
}

/// Runs the sweep: a fresh fabric per node count, four runs per application and shape.
#[must_use]
pub fn run(sweep: &AppSweep, scratch: &Path, progress: &ProgressBar) -> Vec<AppRow> {
    on_fabrics(
        (&sweep.shapes, None),
        "the applications",
        progress,
        |topo, (nodes, ppn)| {
            let mut rows = vec![];
            for &app in &sweep.apps {
                for run in Run::ALL {
                    progress.set_message(format!(
                        "{}, {nodes} nodes × {ppn}, {}",
                        app.name(),
                        run.name()
                    ));
                    rows.push(run_one(topo, app, sweep.size, (nodes, ppn), run, scratch));
                    progress.inc(1);
                }
            }
            rows
        },
    )
}

fn run_one(
    topo: &Topology,
    app: App,
    size: AppSize,
    (nodes, ppn): (usize, usize),
    run: Run,
    scratch: &Path,
) -> AppRow {
    let ranks = nodes * ppn;
    let dir = scratch.join(format!("{}-{nodes}x{ppn}-{}", app.name(), run.tag()));
    let reports_dir = dir.join("reports");
    std::fs::create_dir_all(&reports_dir).expect("the application's scratch directory");
    let innet = run.innet();
    let mut mpirun = launch(
        topo,
        Flavour::OpenMpi,
        (ranks, ppn),
        &app.program(size),
        innet.then_some(reports_dir.as_path()),
    );
    mpirun.timeout_secs = 600;
    if let Some(dir) = petsc_dir() {
        mpirun = mpirun.env("PETSC_DIR", dir);
    }
    let start = Instant::now();
    let out = mpirun.output().expect("spawn mpirun");
    let wall = start.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let log = dir.join("output.txt");
    let _ = std::fs::write(
        &log,
        format!(
            "{stdout}\n--- stderr ---\n{}",
            String::from_utf8_lossy(&out.stderr)
        ),
    );
    let mut row = AppRow {
        app: app.name().into(),
        nodes,
        ppn,
        run: run.name().into(),
        problem: app.problem(size),
        innet,
        wall_s: wall.as_secs_f64(),
        log: log.display().to_string(),
        ..AppRow::default()
    };
    if !out.status.success() {
        row.failed = Some(format!("mpirun: {} (see {})", out.status, log.display()));
        return row;
    }
    let parsed = match app {
        App::Lammps => parse_lammps(&stdout),
        App::Cg => parse_cg(&stdout),
    };
    match parsed {
        Some((per_iteration, iterations, output)) => {
            row.per_iteration_us = per_iteration.as_secs_f64() * 1e6;
            row.iterations = iterations;
            row.output = output;
        }
        None => row.failed = Some(format!("no timing in its output (see {})", log.display())),
    }
    if innet {
        let all = reports(&reports_dir, ranks);
        row.served = all.iter().map(|r| r.network).sum();
        row.fallbacks = all.iter().map(|r| r.fallbacks).sum();
    }
    row
}

/// LAMMPS's loop time per step, its steps, and its thermo table (header to last row).
fn parse_lammps(out: &str) -> Option<(Duration, u64, String)> {
    let lines: Vec<&str> = out.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.split_whitespace().next() == Some("Step"))?;
    let end = header
        + lines[header..]
            .iter()
            .position(|l| l.starts_with("Loop time of"))?;
    // "Loop time of 1.234 on 4 procs for 500 steps with 4000 atoms"
    let words: Vec<&str> = lines[end].split_whitespace().collect();
    let seconds: f64 = words.get(3)?.parse().ok()?;
    let steps: u64 = words
        .get(words.iter().position(|w| *w == "for")? + 1)?
        .parse()
        .ok()?;
    let thermo = lines[header..end]
        .iter()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n");
    Some((
        Duration::from_secs_f64(seconds / steps.max(1) as f64),
        steps,
        thermo,
    ))
}

/// The solver's time per iteration, its iterations and its residual norm.
fn parse_cg(out: &str) -> Option<(Duration, u64, String)> {
    let line = out.lines().find(|l| l.starts_with("cg "))?;
    let field = |key: &str| value(line, key);
    let per_iteration: f64 = field("per_iteration_us")?.parse().ok()?;
    let iterations: u64 = field("iterations")?.parse().ok()?;
    let residual = field("residual")?;
    let rhs = field("rhs_norm")?;
    Some((
        Duration::from_secs_f64(per_iteration / 1e6),
        iterations,
        format!("{residual} of {rhs}"),
    ))
}

/// Per application and shape: plain MPI's time (the mean of the runs before and after)
/// over innet's, per iteration and start to finish, and whether the output matched.
#[derive(Clone, Debug, PartialEq)]
pub struct AppSpeed {
    pub app: String,
    pub problem: String,
    pub nodes: usize,
    pub ppn: usize,
    pub per_iteration: f64,
    pub wall: f64,
    /// The output (LAMMPS's thermo table, the solver's residual norm) is the same text as
    /// every plain run's.
    pub identical: bool,
    /// The solver's residuals' relative difference (0 for LAMMPS's identical tables).
    pub difference: f64,
}

/// The speeds of every complete shape in `rows`.
#[must_use]
pub fn speeds(rows: &[AppRow]) -> Vec<AppSpeed> {
    let mut out = vec![];
    for innet in rows.iter().filter(|r| r.innet && r.failed.is_none()) {
        let plain: Vec<&AppRow> = rows
            .iter()
            .filter(|p| {
                !p.innet
                    && p.counts()
                    && (p.app.as_str(), p.nodes, p.ppn)
                        == (innet.app.as_str(), innet.nodes, innet.ppn)
            })
            .collect();
        if plain.is_empty() {
            continue;
        }
        let mean =
            |f: fn(&AppRow) -> f64| plain.iter().map(|p| f(p)).sum::<f64>() / plain.len() as f64;
        let difference = plain
            .iter()
            .map(|p| relative_difference(&p.output, &innet.output))
            .fold(0.0, f64::max);
        out.push(AppSpeed {
            app: innet.app.clone(),
            problem: innet.problem.clone(),
            nodes: innet.nodes,
            ppn: innet.ppn,
            per_iteration: mean(|r| r.per_iteration_us) / innet.per_iteration_us,
            wall: mean(|r| r.wall_s) / innet.wall_s,
            identical: plain.iter().all(|p| p.output == innet.output),
            difference,
        });
    }
    out
}

/// How far apart two outputs are: 0 when equal; for the solver's `R of B` (final residual
/// norm of the right-hand side's), the residuals' difference relative to `B` (a solve
/// converged to round-off ends at residuals that differ among themselves, all far below
/// what the solve started from); else 1.
fn relative_difference(a: &str, b: &str) -> f64 {
    if a == b {
        return 0.0;
    }
    let numbers = |s: &str| {
        let (r, rhs) = s.split_once(" of ")?;
        Some((r.parse::<f64>().ok()?, rhs.parse::<f64>().ok()?))
    };
    match (numbers(a), numbers(b)) {
        (Some((x, bx)), Some((y, by))) => (x - y).abs() / bx.max(by).max(f64::MIN_POSITIVE),
        _ => 1.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lammps_output_gives_loop_time_steps_and_thermo() {
        let out = "LAMMPS (7 Jan 2022)\n\
                   Per MPI rank memory allocation (min/avg/max) = 3.1 | 3.1 | 3.1 Mbytes\n   \
                   Step          Temp          PotEng\n         \
                   0   1.5  -6.7733681\n         \
                   1   1.4999  -6.773\n\
                   Loop time of 0.5 on 4 procs for 1 steps with 4000 atoms\n\n\
                   Performance: 1 tau/day\n";
        let (per, steps, thermo) = parse_lammps(out).expect("parsed");
        assert_eq!(steps, 1);
        assert_eq!(per, Duration::from_millis(500));
        assert_eq!(
            thermo,
            "Step Temp PotEng\n0 1.5 -6.7733681\n1 1.4999 -6.773"
        );
    }

    #[test]
    fn cg_output_gives_its_fields() {
        let out = "cg grid=64 ranks=4 iterations=50 seconds=0.01 per_iteration_us=200.5 \
                   residual=1.25e-03 rhs_norm=6.4e+01\n";
        let (per, its, residual) = parse_cg(out).expect("parsed");
        assert_eq!((its, residual.as_str()), (50, "1.25e-03 of 6.4e+01"));
        assert_eq!(per, Duration::from_secs_f64(200.5e-6));
        assert!(parse_cg("nothing here").is_none());
    }

    #[test]
    fn speeds_compare_innet_with_the_mean_of_the_plain_runs_around_it() {
        let row = |run: Run, per: f64, output: &str| AppRow {
            app: "petsc-cg".into(),
            nodes: 4,
            ppn: 1,
            run: run.name().into(),
            innet: run.innet(),
            wall_s: per,
            per_iteration_us: per,
            output: output.into(),
            ..AppRow::default()
        };
        let rows = [
            row(Run::WarmUp, 1000.0, "1.0 of 100"),
            row(Run::Plain, 300.0, "1.0 of 100"),
            row(Run::Innet, 100.0, "1.0000001 of 100"),
            row(Run::PlainAgain, 100.0, "1.0 of 100"),
        ];
        let s = &speeds(&rows)[0];
        assert!((s.per_iteration - 2.0).abs() < 1e-12, "{s:?}");
        assert!(!s.identical);
        assert!((s.difference - 1e-9).abs() < 1e-12, "{s:?}");
    }
}
