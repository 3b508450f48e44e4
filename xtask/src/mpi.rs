//! The MPI side: `libinnet_mpi.a` (cargo), then per MPI implementation the interposer
//! `libinnet-mpi-<flavour>.so` (the C shim against that implementation's `mpi.h`, linked with
//! the Rust library) and the MPI programs (`mpi_check`, `osu_allreduce`, `steady_allreduce`,
//! `nbc_check`, `barrier_skew`, `nbc_overlap`), all into
//! `target/<profile>/mpi/`. Also fetches mpi4py's test suite (the sdist matching Debian's
//! python3-mpi4py, checked by SHA-256) for the tests.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::shell::{cargo, exec, workspace};

/// Debian's MPI implementations: (flavour, its compiler wrapper).
pub const FLAVOURS: [(&str, &str); 2] = [("openmpi", "mpicc.openmpi"), ("mpich", "mpicc.mpich")];
/// The MPI programs built for each flavour.
/// The interposer's C files (`innet-mpi/shim/`), compiled per MPI implementation.
const SHIM_SOURCES: [&str; 3] = ["innet_mpi.c", "nonblocking.c", "trials.c"];
const SHIM_HEADERS: [&str; 1] = ["shim.h"];

const PROGRAMS: [&str; 6] = [
    "mpi_check",
    "osu_allreduce",
    "steady_allreduce",
    "nbc_check",
    "barrier_skew",
    "nbc_overlap",
];

const MPI4PY: &str = "mpi4py-3.1.4";
/// PyPI's content-addressed path (the `/packages/source/` shortcut is not served
/// everywhere: it answered 404 on CI).
const MPI4PY_URL: &str = "https://files.pythonhosted.org/packages/bc/f2/\
     749af7fd0e7703ddca6cea525ab40f26c3ca6cbe6c23658441c6f9705860/mpi4py-3.1.4.tar.gz";
const MPI4PY_SHA256: &str = "17858f2ebc623220d0120d1fa8d428d033dde749c4bc35b33d81a66ad7f93480";

/// Builds the Rust library, then each flavour's interposer and programs.
pub fn build(release: bool) -> Result<()> {
    let profile = if release { "release" } else { "debug" };
    let mut c = cargo();
    c.current_dir(workspace())
        .args(["build", "--package", "innet-mpi", "--lib"])
        .args(["--bin", "innet-mpi-header"]);
    if release {
        c.arg("--release");
    }
    exec(&mut c)?;
    let target = workspace().join("target").join(profile);
    let out = target.join("mpi");
    let include = out.join("include");
    std::fs::create_dir_all(&include).with_context(|| format!("creating {}", include.display()))?;
    let header = write_header(&target, &include)?;
    let src = workspace().join("innet-mpi");
    let staticlib = target.join("libinnet_mpi.a");
    let shim_inputs: Vec<PathBuf> = SHIM_SOURCES
        .iter()
        .chain(&SHIM_HEADERS)
        .map(|f| src.join("shim").join(f))
        .chain([staticlib.clone(), header])
        .collect();
    for (flavour, mpicc) in FLAVOURS {
        let so = out.join(format!("libinnet-mpi-{flavour}.so"));
        compile(
            Command::new(mpicc)
                .args([
                    "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared",
                ])
                .args(["-fvisibility=hidden", "-I"])
                .arg(&include)
                .arg("-I")
                .arg(src.join("shim"))
                .arg("-o")
                .arg(&so)
                .args(SHIM_SOURCES.iter().map(|f| src.join("shim").join(f)))
                .arg(&staticlib)
                // Only the MPI_* entry points leave the library, not Rust's symbols.
                .args(["-Wl,--exclude-libs,ALL", "-lpthread", "-ldl", "-lm"]),
            &shim_inputs.iter().map(PathBuf::as_path).collect::<Vec<_>>(),
            &so,
        )?;
        for program in PROGRAMS {
            let bin = out.join(format!("{program}-{flavour}"));
            let source = src.join("programs").join(format!("{program}.c"));
            compile(
                Command::new(mpicc)
                    .args(["-O2", "-g", "-Wall", "-Werror", "-o"])
                    .arg(&bin)
                    .arg(&source),
                &[&source],
                &bin,
            )?;
        }
    }
    Ok(())
}

/// The shim's C header, generated from Rust (`innet-mpi/src/header.rs`) into `include`;
/// written only when it changed, so that an unchanged header rebuilds nothing.
fn write_header(target: &Path, include: &Path) -> Result<PathBuf> {
    let generator = target.join("innet-mpi-header");
    let made = Command::new(&generator)
        .output()
        .with_context(|| format!("running {}", generator.display()))?;
    if !made.status.success() {
        bail!("{} failed: {}", generator.display(), made.status);
    }
    let path = include.join("innet_mpi.h");
    if std::fs::read(&path).ok().as_deref() != Some(made.stdout.as_slice()) {
        std::fs::write(&path, &made.stdout)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(path)
}

/// Runs `cmd` unless `output` is newer than every input.
fn compile(cmd: &mut Command, inputs: &[&Path], output: &Path) -> Result<()> {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if let Some(out) = modified(output)
        && inputs.iter().all(|i| modified(i).is_some_and(|t| t <= out))
    {
        return Ok(());
    }
    exec(cmd)
}

/// mpi4py's test directory, fetched once into `target/`.
pub fn mpi4py_tests() -> Result<PathBuf> {
    let root = workspace().join("target");
    let dir = root.join(MPI4PY).join("test");
    if dir.join("runtests.py").exists() {
        return Ok(dir);
    }
    let tarball = root.join(format!("{MPI4PY}.tar.gz"));
    exec(
        Command::new("curl")
            .args(["-fsSL", "--retry", "3", "-o"])
            .arg(&tarball)
            .arg(MPI4PY_URL),
    )?;
    let sum = Command::new("sha256sum")
        .arg(&tarball)
        .output()
        .context("sha256sum")?;
    let text = String::from_utf8_lossy(&sum.stdout);
    if !text.starts_with(MPI4PY_SHA256) {
        bail!(
            "{} has SHA-256 {}, expected {MPI4PY_SHA256}: delete it and retry",
            tarball.display(),
            text.split_whitespace().next().unwrap_or("?")
        );
    }
    exec(
        Command::new("tar")
            .arg("-xzf")
            .arg(&tarball)
            .arg("-C")
            .arg(&root),
    )?;
    Ok(dir)
}
