//! `cargo xtask <command>`: everything between a fresh machine and a passing test run.

mod arm;
mod build;
mod fuzz;
mod mpi;
mod osu;
mod phases;
mod setup;
mod shell;
mod test;
mod tool;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "innet build tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what this machine lacks: Debian packages, bpf-linker, a mounted bpffs
    Setup,
    /// Build the eBPF object and the `innet` binary (runs setup first)
    Build(build::Options),
    /// Run every test: unit, BPF_PROG_TEST_RUN, network namespaces, tshark (runs setup first)
    Test(test::Options),
    /// Build, then run the demo on a built-in namespace topology, then tear it down
    Demo(build::DemoOptions),
    /// Build in release mode, then run the benchmarks: latency sweeps of every mode on
    /// namespace fabrics, XDP cost per packet; JSON, markdown report and plots
    Bench(tool::Options),
    /// Build in release mode, then run the reliability campaign: loss, duplication and
    /// reordering at several rates in every mode, group churn (or `soak`); JSON and report
    Campaign(tool::Options),
    /// Run every cargo fuzz target (userspace parsers) for a bounded time
    Fuzz(fuzz::Options),
    /// Build the OSU micro-benchmarks the bench runs (`innet-bench --osu`) from a source
    /// tree you provide, into `target/osu/<flavour>/`
    Osu(osu::Options),
    /// Cross-build `innet` for aarch64 and check it under qemu-aarch64: help, the example
    /// capture against this machine's, innet-common's unit tests (`test` runs this too)
    Arm,
    /// The checks `test` runs beside the tests at the lowest CPU priority: docs, the Arm
    /// side, the fuzz targets (the machine set up and built by `test` first)
    #[command(hide = true)]
    Beside(test::BesideOptions),
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Setup => setup::run(),
        Command::Build(o) => {
            setup::run()?;
            build::run(&o)
        }
        Command::Test(o) => {
            let mut phases = phases::Phases::default();
            phases.time("setup", setup::run)?;
            test::run(&o, &mut phases)
        }
        Command::Bench(o) => {
            setup::run()?;
            tool::run("innet-bench", "bench", &o)
        }
        Command::Campaign(o) => {
            setup::run()?;
            tool::run("innet-campaign", "campaign", &o)
        }
        Command::Arm => {
            setup::run()?;
            build::run(&build::Options {
                release: false,
                target: None,
            })?;
            arm::run()
        }
        Command::Beside(o) => test::beside(&o),
        Command::Fuzz(o) => {
            setup::run()?;
            fuzz::run(&o)
        }
        Command::Osu(o) => {
            setup::run()?;
            osu::run(&o)
        }
        Command::Demo(o) => {
            anyhow::ensure!(
                o.build.target.is_none(),
                "the demo runs on this machine: drop --target"
            );
            setup::run()?;
            // The demo shows speed: release binaries (cached after the first build).
            let build = build::Options {
                release: true,
                ..o.build
            };
            build::run(&build)?;
            build::demo(&build, &o.args)
        }
    }
}
