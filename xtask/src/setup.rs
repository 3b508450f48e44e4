//! Idempotent machine setup (the README's two commands run it first): Debian's rustc with a
//! precompiled `core` for bpfel, LLVM 22 to build bpf-linker against, the tools tests use,
//! and a mounted bpffs. When nothing is missing it only runs a few `dpkg-query`s.

use std::{path::Path, process::Command};

use anyhow::{Result, bail};

use crate::shell::{cargo, exec, succeeds};

const PACKAGES: &[&str] = &[
    "rustc-web",
    "libstd-rust-web-dev-bpf",
    "llvm-22-dev",
    "libpolly-22-dev",
    "zlib1g-dev",
    "libzstd-dev",
    "bpftool",
    "iproute2",
    "ethtool",
    "iputils-ping",
    "util-linux",
    "tshark",
    // The benchmark's plots measure and draw text with it.
    "fonts-dejavu-core",
    // innet under MPI: both of Debian's implementations, mpi4py (built against OpenMPI) and
    // curl for its test suite.
    "libopenmpi-dev",
    "openmpi-bin",
    "libmpich-dev",
    "mpich",
    "python3-mpi4py",
    "curl",
    // `cargo xtask osu` builds OSU's benchmarks (mpicxx links them) from its shipped
    // configure: no autotools.
    "make",
    "g++",
    // The metrics test scrapes `innet daemon --metrics` with a real Prometheus server and
    // checks the exposition with promtool.
    "prometheus",
    "iperf3",
    // The benchmark's whole applications (its smoke form runs in the tests): LAMMPS, and
    // PETSc's CG through petsc4py.
    "lammps",
    "python3-petsc4py",
];
const BPF_LINKER_VERSION: &str = "0.13.0";

pub fn run() -> Result<()> {
    let missing: Vec<&str> = PACKAGES.iter().copied().filter(|p| !installed(p)).collect();
    apt_install(&missing)?;
    if !bpf_linker_ok() {
        eprintln!(
            "setup: building bpf-linker {BPF_LINKER_VERSION} against LLVM 22 (about a minute)"
        );
        exec(
            cargo()
                .args([
                    "install",
                    "bpf-linker",
                    "--version",
                    BPF_LINKER_VERSION,
                    "--locked",
                    "--no-default-features",
                    "--features",
                    "llvm-22",
                ])
                .env("LLVM_PREFIX", "/usr/lib/llvm-22"),
        )?;
    }
    if !bpffs_mounted() {
        require_root("mounting the BPF filesystem")?;
        exec(Command::new("mount").args(["-t", "bpf", "bpf", "/sys/fs/bpf"]))?;
    }
    Ok(())
}

/// The one cross target innet builds for (SmartNICs such as BlueField run aarch64 Linux).
pub const AARCH64: &str = "aarch64-unknown-linux-gnu";
const AARCH64_PACKAGES: &[&str] = &["gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross"];
/// The C toolchain's linker for it (also named in `.cargo/config.toml`).
pub const AARCH64_LINKER: &str = "aarch64-linux-gnu-gcc";

/// Adds what a cross build for `target` needs: rustup's standard library for it and the
/// Debian cross linker. Only [`AARCH64`] is known.
pub fn cross(target: &str) -> Result<()> {
    if target != AARCH64 {
        bail!("cross builds are set up for {AARCH64} only (got {target})");
    }
    apt_install_missing(AARCH64_PACKAGES)?;
    let has_std = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l == target)
        });
    if !has_std {
        exec(Command::new("rustup").args(["target", "add", target]))?;
    }
    Ok(())
}

/// Installs those of `packages` this machine lacks.
pub fn apt_install_missing(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages.iter().copied().filter(|p| !installed(p)).collect();
    apt_install(&missing)
}

/// Installs Debian packages (nothing when `missing` is empty).
fn apt_install(missing: &[&str]) -> Result<()> {
    if missing.is_empty() {
        return Ok(());
    }
    require_root(&format!("installing {}", missing.join(" ")))?;
    eprintln!("setup: installing {}", missing.join(" "));
    exec(Command::new("apt-get").args(["update", "-qq"]))?;
    exec(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|o| {
            o.status.success()
                && String::from_utf8_lossy(&o.stdout).contains("install ok installed")
        })
}

fn bpf_linker_ok() -> bool {
    Command::new("bpf-linker")
        .arg("--version")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(BPF_LINKER_VERSION))
}

fn bpffs_mounted() -> bool {
    Path::new("/sys/fs/bpf").exists()
        && succeeds(Command::new("findmnt").args(["-n", "-t", "bpf", "/sys/fs/bpf"]))
}

fn require_root(what: &str) -> Result<()> {
    if !succeeds(Command::new("test").args(["-w", "/"])) {
        bail!(
            "{what} needs root: run it as root (`sudo -E env \"PATH=$PATH\" cargo xtask setup` from another account)"
        );
    }
    Ok(())
}
