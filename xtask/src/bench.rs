//! `cargo xtask bench [ARGS]`: builds the release binaries and runs `innet-bench` with ARGS
//! (`--quick`, `--smoke`, `--out DIR`, sweep settings; `cargo xtask bench --help` lists them).
//! It writes `bench.json`, `report.md` and the plots into `--out` (default `target/bench`).

use std::process::Command;

use anyhow::{Result, bail};
use clap::Args;

use crate::shell::{cargo, exec, succeeds, workspace};

#[derive(Args)]
#[command(disable_help_flag = true)]
pub struct Options {
    /// Arguments for innet-bench (try --help)
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<String>,
}

pub fn run(o: &Options) -> Result<()> {
    let help = o.args.iter().any(|a| a == "--help" || a == "-h");
    if !help && !succeeds(Command::new("test").args(["-w", "/"])) {
        bail!(
            "the benchmark loads BPF programs and creates network namespaces: run `sudo -E cargo xtask bench`"
        );
    }
    // Release builds: the figures are for what users run.
    exec(cargo().current_dir(workspace()).args([
        "build",
        "--release",
        "--package",
        "innet-user",
        "--package",
        "innet-tests",
        "--bins",
    ]))?;
    exec(
        Command::new(workspace().join("target/release/innet-bench"))
            .current_dir(workspace())
            .args(&o.args),
    )
}
