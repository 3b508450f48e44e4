//! `cargo xtask bench [ARGS]` and `cargo xtask campaign [ARGS]`: build the release binaries
//! and run `innet-bench` or `innet-campaign` with ARGS (`--help` lists them). The bench
//! writes `bench.json`, `report.md` and plots into `--out` (default `target/bench`); the
//! campaign `campaign.json` and `report.md` (default `target/campaign`).

use std::process::Command;

use anyhow::{Result, bail};
use clap::Args;

use crate::shell::{exec_in_place, succeeds, workspace};

#[derive(Args)]
#[command(disable_help_flag = true)]
pub struct Options {
    /// Arguments for the tool (try --help)
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<String>,
}

/// Builds the release binaries and runs `tool` (`innet-bench`, `innet-campaign`) with the
/// arguments; `task` names the xtask command in the message when not root.
pub fn run(tool: &str, task: &str, o: &Options) -> Result<()> {
    let help = o.args.iter().any(|a| a == "--help" || a == "-h");
    if !help && !succeeds(Command::new("test").args(["-w", "/"])) {
        bail!(
            "{tool} loads BPF programs and creates network namespaces: run it as root (`sudo -E env \"PATH=$PATH\" cargo xtask {task}` from another account)"
        );
    }
    // Release builds: the figures are for what users run. The MPI interposers and
    // programs too: the bench runs osu_allreduce under mpirun, the campaign a long-running
    // MPI program whose group vanishes.
    crate::build::run(&crate::build::Options {
        release: true,
        target: None,
    })?;
    exec_in_place(
        Command::new(workspace().join("target/release").join(tool))
            .current_dir(workspace())
            .args(&o.args),
    )
}
