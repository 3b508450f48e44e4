//! Every test: unit tests, BPF_PROG_TEST_RUN, network namespaces, tshark, the crates' docs
//! (rustdoc without a warning), the aarch64 build under qemu-aarch64 (`arm`), then each cargo
//! fuzz target for a bounded time. The privileged ones need root and fail (never skip)
//! without it. Prints one `N passed, N failed` line summed over every test binary.

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};
use clap::Args;

use crate::{
    phases::Phases,
    shell::{cargo, exec, succeeds, workspace},
};

#[derive(Args)]
pub struct Options {
    /// Seconds each cargo fuzz target runs after the tests (0: none)
    #[arg(long, default_value_t = 15)]
    pub fuzz_seconds: u64,
    /// Extra arguments for the test binaries after `--` (e.g. a test name filter)
    #[arg(last = true)]
    pub args: Vec<String>,
}

/// Every test, each phase timed (`setup` is timed by the caller into `phases`).
pub fn run(o: &Options, phases: &mut Phases) -> Result<()> {
    let result = run_phases(o, phases);
    println!("{}", phases.summary());
    result
}

fn run_phases(o: &Options, phases: &mut Phases) -> Result<()> {
    if !succeeds(Command::new("test").args(["-w", "/"])) {
        bail!(
            "the tests load BPF programs and create network namespaces: run them as root (`sudo -E env \"PATH=$PATH\" cargo xtask test` from another account)"
        );
    }
    // The CLI tests run the `innet` binary and the lab's tools (bench, campaign), the MPI
    // tests mpirun on the interposers and programs: build them (and the eBPF objects) first.
    phases.time("build", || {
        crate::build::run(&crate::build::Options {
            release: false,
            target: None,
        })
    })?;
    phases.time("mpi4py", crate::mpi::mpi4py_tests)?;
    phases.time("cargo test", || cargo_test(o))?;
    // The crates' docs (innet-lab's and innet-client's are their manuals) and the Arm
    // side, when the whole suite runs (a filter picks tests of this machine).
    if o.args.is_empty() {
        phases.time("docs", || {
            exec(
                cargo()
                    .current_dir(workspace())
                    .args(["doc", "--no-deps", "--workspace", "--exclude", "innet-ebpf"])
                    .env("RUSTDOCFLAGS", "-D warnings"),
            )
        })?;
        println!("docs: every crate's documentation builds without a warning");
        phases.time("arm", crate::arm::run)?;
    }
    if o.fuzz_seconds > 0 {
        phases.time("fuzz", || {
            crate::fuzz::run(&crate::fuzz::Options {
                seconds: o.fuzz_seconds,
                targets: vec![],
                // A smoke run: building unoptimised saves minutes on a fresh machine.
                dev: true,
            })
        })?;
        println!(
            "fuzz: {} targets ran {} s each without a crash",
            crate::fuzz::TARGETS.len(),
            o.fuzz_seconds
        );
    }
    Ok(())
}

/// `cargo test` over the workspace, its output passed through and its counts summed.
fn cargo_test(o: &Options) -> Result<()> {
    let mut child = cargo()
        .current_dir(workspace())
        .args([
            "test",
            "--workspace",
            "--exclude",
            "innet-ebpf",
            "--no-fail-fast",
        ])
        .args(if o.args.is_empty() {
            vec![]
        } else {
            [vec!["--".to_owned()], o.args.clone()].concat()
        })
        .env("RUST_BACKTRACE", "1")
        .stdout(Stdio::piped())
        .spawn()
        .context("spawning cargo test")?;
    let (mut passed, mut failed) = (0u64, 0u64);
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line.context("reading cargo test output")?;
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            passed += count(rest, " passed");
            failed += count(rest, " failed");
        }
    }
    let status = child.wait().context("waiting for cargo test")?;
    println!("tests: {passed} passed, {failed} failed");
    if !status.success() || failed > 0 {
        bail!("tests failed ({status})");
    }
    if passed == 0 {
        bail!("no test ran");
    }
    Ok(())
}

/// The number before `label` in a `test result:` line (`ok. 12 passed; 0 failed; …`).
fn count(summary: &str, label: &str) -> u64 {
    summary
        .split(';')
        .find_map(|part| {
            part.trim()
                .trim_start_matches("ok. ")
                .trim_start_matches("FAILED. ")
                .strip_suffix(label.trim_start())
        })
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}
