//! `cargo xtask osu --source PATH`: builds the OSU micro-benchmarks' C MPI collective
//! and point-to-point (`latency`, `bw`) benchmarks the bench runs (`innet-bench --osu`) from a source tree the user provides
//! (an unpacked `osu-micro-benchmarks-7.x.tar.gz` from mvapich.cse.ohio-state.edu, or a
//! checkout with `configure` in it: OSU is in no package registry CI reaches).
//!
//! Per MPI implementation: `configure CC=mpicc.<flavour> CXX=mpicxx.<flavour>` out of the
//! source tree in `target/osu/build-<flavour>`, `make` of the asked benchmarks only, and
//! the binaries copied into `target/osu/<flavour>/` with a `VERSION` file.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail, ensure};
use clap::Args;

use crate::{
    mpi::FLAVOURS,
    shell::{exec, workspace},
};

/// The benchmarks issue 34's targets are stated with.
pub const DEFAULT_TESTS: [&str; 5] = [
    "iallreduce",
    "ibarrier",
    "ibcast",
    "allgather",
    "reduce_scatter",
];

#[derive(Args)]
pub struct Options {
    /// OSU's source tree (an unpacked release tarball: it holds `configure`)
    #[arg(long, value_name = "PATH")]
    pub source: PathBuf,
    /// MPI implementations to build for (openmpi, mpich)
    #[arg(long, value_delimiter = ',', default_value = "openmpi")]
    pub flavours: Vec<String>,
    /// Benchmarks to build, without `osu_` (non-blocking ones start with `i`)
    #[arg(long, value_delimiter = ',', default_values_t = DEFAULT_TESTS.map(String::from))]
    pub tests: Vec<String>,
}

pub fn run(o: &Options) -> Result<()> {
    let source = o
        .source
        .canonicalize()
        .with_context(|| format!("OSU source {}", o.source.display()))?;
    ensure!(
        source.join("configure").is_file() && source.join("c/mpi/collective").is_dir(),
        "{} is not an OSU micro-benchmarks source tree (no configure or c/mpi/collective): \
         unpack osu-micro-benchmarks-7.x.tar.gz from mvapich.cse.ohio-state.edu and pass its \
         directory",
        source.display()
    );
    // configure refuses to build out of a tree that was configured in place.
    ensure!(
        !source.join("config.status").exists(),
        "{} was configured in place: run `make distclean` there or unpack a fresh copy",
        source.display()
    );
    for t in &o.tests {
        ensure!(
            source
                .join(collective_dir(t))
                .join(format!("osu_{t}.c"))
                .is_file(),
            "this OSU source has no osu_{t}.c in {} (osu_iallreduce needs OSU 5.4 or newer)",
            collective_dir(t)
        );
    }
    for name in &o.flavours {
        let Some(&(flavour, mpicc)) = FLAVOURS.iter().find(|(f, _)| f == name) else {
            bail!("unknown MPI {name:?}: use openmpi or mpich");
        };
        build(&source, flavour, mpicc, &o.tests)?;
    }
    Ok(())
}

/// OSU's point-to-point benchmarks the bench runs (two ranks; no collective of innet's).
const POINT_TO_POINT: [&str; 2] = ["latency", "bw"];

/// Where OSU keeps `osu_<test>.c`, relative to the source root.
fn collective_dir(test: &str) -> &'static str {
    if POINT_TO_POINT.contains(&test) {
        "c/mpi/pt2pt/standard"
    } else if test.starts_with('i') {
        "c/mpi/collective/non_blocking"
    } else {
        "c/mpi/collective/blocking"
    }
}

fn build(source: &Path, flavour: &str, mpicc: &str, tests: &[String]) -> Result<()> {
    let root = workspace().join("target/osu");
    let build = root.join(format!("build-{flavour}"));
    let out = root.join(flavour);
    std::fs::create_dir_all(&build).with_context(|| format!("creating {}", build.display()))?;
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let mpicxx = mpicc.replace("mpicc", "mpicxx");
    // A build directory configured from another source tree builds that tree: start over.
    let configured_from = std::fs::read_to_string(build.join("Makefile"))
        .ok()
        .and_then(|m| makefile_var(&m, "abs_top_srcdir"));
    if configured_from.as_deref() != Some(&*source.to_string_lossy()) {
        eprintln!("osu: configuring {} for {flavour}", source.display());
        exec(
            Command::new(source.join("configure"))
                .current_dir(&build)
                .arg(format!("CC={mpicc}"))
                .arg(format!("CXX={mpicxx}"))
                .arg("--quiet"),
        )?;
    }
    for dir in [
        "c/mpi/collective/blocking",
        "c/mpi/collective/non_blocking",
        "c/mpi/pt2pt/standard",
    ] {
        let programs: Vec<String> = tests
            .iter()
            .filter(|t| collective_dir(t) == dir)
            .map(|t| format!("osu_{t}"))
            .collect();
        if programs.is_empty() {
            continue;
        }
        // Unpacked trees can leave Makefile.am looking newer than Makefile.in (or
        // configure.ac than configure): the shipped files are what we build, so the
        // autotools' regeneration rules run nothing (no automake needed).
        exec(
            Command::new("make")
                .current_dir(build.join(dir))
                .args(["-j2", "--quiet"])
                .args([
                    "ACLOCAL=true",
                    "AUTOMAKE=true",
                    "AUTOCONF=true",
                    "AUTOHEADER=true",
                ])
                .args(&programs),
        )?;
        for p in &programs {
            let from = build.join(dir).join(p);
            std::fs::copy(&from, out.join(p))
                .with_context(|| format!("copying {}", from.display()))?;
        }
    }
    let makefile = std::fs::read_to_string(build.join("Makefile")).context("OSU's Makefile")?;
    let version = makefile_var(&makefile, "PACKAGE_VERSION").unwrap_or_default();
    std::fs::write(out.join("VERSION"), format!("{version}\n"))?;
    eprintln!(
        "osu: OSU {version} for {flavour}: {} in {}",
        tests
            .iter()
            .map(|t| format!("osu_{t}"))
            .collect::<Vec<_>>()
            .join(", "),
        out.display()
    );
    Ok(())
}

/// `NAME = value` of a generated Makefile.
fn makefile_var(makefile: &str, name: &str) -> Option<String> {
    makefile.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == name).then(|| v.trim().to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::{collective_dir, makefile_var};

    #[test]
    fn reads_a_makefile_variable_and_places_the_benchmarks() {
        let m = "PACKAGE_TARNAME = osu-micro-benchmarks\nPACKAGE_VERSION = 7.4\nabs_top_srcdir = /src\n";
        assert_eq!(makefile_var(m, "PACKAGE_VERSION").as_deref(), Some("7.4"));
        assert_eq!(makefile_var(m, "abs_top_srcdir").as_deref(), Some("/src"));
        assert_eq!(makefile_var(m, "VERSION"), None);
        assert_eq!(collective_dir("ibcast"), "c/mpi/collective/non_blocking");
        assert_eq!(
            collective_dir("reduce_scatter"),
            "c/mpi/collective/blocking"
        );
        assert_eq!(collective_dir("latency"), "c/mpi/pt2pt/standard");
    }
}
