//! `cargo xtask fuzz`: every `cargo fuzz` target of `fuzz/` (the userspace parsers: frames,
//! control payloads, the CLI) for a bounded time each. Installs cargo-fuzz when missing.
//! The stable toolchain runs it with `RUSTC_BOOTSTRAP=1` (cargo fuzz passes `-Z` flags).

use anyhow::{Context as _, Result};
use clap::Args;

use crate::shell::{cargo, exec, succeeds, workspace};

pub const TARGETS: [&str; 4] = ["inc_frame", "client_frame", "control_payload", "cli"];

#[derive(Args)]
pub struct Options {
    /// Seconds per target
    #[arg(long, default_value_t = 300)]
    pub seconds: u64,
    /// Only these targets (default: all)
    #[arg(long, value_delimiter = ',')]
    pub targets: Vec<String>,
    /// Build the targets unoptimised (`cargo fuzz --dev`): minutes quicker to build on a
    /// fresh machine, slower per input; what the tests' short runs use
    #[arg(long)]
    pub dev: bool,
}

pub fn run(o: &Options) -> Result<()> {
    if !succeeds(cargo().args(["fuzz", "--version"])) {
        exec(cargo().args(["install", "cargo-fuzz", "--locked", "--version", "0.13.2"]))
            .context("installing cargo-fuzz")?;
    }
    let targets: Vec<&str> = if o.targets.is_empty() {
        TARGETS.to_vec()
    } else {
        o.targets.iter().map(String::as_str).collect()
    };
    for t in targets {
        let corpus = workspace().join("target/fuzz-corpus").join(t);
        std::fs::create_dir_all(&corpus).with_context(|| format!("{}", corpus.display()))?;
        println!("fuzzing {t} for {} s", o.seconds);
        exec(
            cargo()
                .current_dir(workspace())
                .env("RUSTC_BOOTSTRAP", "1")
                .args(["fuzz", "run", "--fuzz-dir", "fuzz", t])
                .args(o.dev.then_some("--dev"))
                .arg(&corpus)
                .args(["--", &format!("-max_total_time={}", o.seconds)]),
        )?;
    }
    Ok(())
}
