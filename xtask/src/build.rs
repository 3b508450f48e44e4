//! Building: `innet-objects`' build script compiles the eBPF objects with Debian's rustc and
//! embeds them, so building the `innet` binary builds everything; `run` also builds the
//! lab's tools, the tests' helper programs and the MPI interposers and programs.

use std::process::Command;

use anyhow::Result;
use clap::Args;

use crate::{
    setup,
    shell::{cargo, exec, exec_in_place, workspace},
};

#[derive(Args)]
pub struct Options {
    /// Build in release mode
    #[arg(long)]
    pub release: bool,
    /// Cross-build the `innet` binary for this target (aarch64-unknown-linux-gnu: a
    /// SmartNIC's Arm cores); the eBPF object inside is the same bytecode
    #[arg(long, value_name = "TRIPLE")]
    pub target: Option<String>,
}

pub fn run(o: &Options) -> Result<()> {
    if let Some(target) = &o.target {
        setup::cross(target)?;
        let mut c = cargo();
        c.current_dir(workspace()).args([
            "build",
            "--package",
            "innet-user",
            "--bins",
            "--target",
            target,
        ]);
        if o.release {
            c.arg("--release");
        }
        return exec(c.env(
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER",
            setup::AARCH64_LINKER,
        ));
    }
    let mut c = cargo();
    c.current_dir(workspace()).args([
        "build",
        "--package",
        "innet-user",
        "--package",
        "innet-lab",
        "--package",
        "innet-tools",
        "--package",
        "innet-tests",
        "--bins",
    ]);
    if o.release {
        c.arg("--release");
    }
    exec(&mut c)?;
    crate::mpi::build(o.release)
}

/// `cargo xtask demo`: how to build, and the demo's own options.
#[derive(Args)]
pub struct DemoOptions {
    #[command(flatten)]
    pub build: Options,
    /// The demo's options (`--levels 3`, `--link-rate 200mbit`; try --help)
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<String>,
}

/// Runs the demo binary of the test harness with `args` (it builds and always tears down
/// its topology).
pub fn demo(o: &Options, args: &[String]) -> Result<()> {
    let profile = if o.release { "release" } else { "debug" };
    let bin = workspace().join("target").join(profile).join("innet-demo");
    exec_in_place(Command::new(bin).args(args).env(
        "INNET_BIN",
        workspace().join("target").join(profile).join("innet"),
    ))
}
