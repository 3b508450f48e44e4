//! Building: `innet-user`'s build script compiles the eBPF object with Debian's rustc and
//! embeds it, so building the `innet` binary builds everything.

use std::process::Command;

use anyhow::Result;
use clap::Args;

use crate::shell::{cargo, exec, workspace};

#[derive(Args)]
pub struct Options {
    /// Build in release mode
    #[arg(long)]
    pub release: bool,
}

pub fn run(o: &Options) -> Result<()> {
    let mut c = cargo();
    c.current_dir(workspace()).args([
        "build",
        "--package",
        "innet-user",
        "--package",
        "innet-tests",
        "--bins",
    ]);
    if o.release {
        c.arg("--release");
    }
    exec(&mut c)
}

/// Runs the demo binary of the test harness (it builds and always tears down its topology).
pub fn demo(o: &Options) -> Result<()> {
    let profile = if o.release { "release" } else { "debug" };
    let bin = workspace().join("target").join(profile).join("innet-demo");
    exec(Command::new(bin).env(
        "INNET_BIN",
        workspace().join("target").join(profile).join("innet"),
    ))
}
