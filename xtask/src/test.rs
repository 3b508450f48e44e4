//! Every test: unit tests, BPF_PROG_TEST_RUN, network namespaces, tshark, the lints (clippy
//! without a warning), the crates' docs (rustdoc without a warning), the aarch64 build under qemu-aarch64 (`arm`), then each cargo
//! fuzz target for a bounded time. The privileged ones need root and fail (never skip)
//! without it. Prints one `N passed, N failed` line summed over every test binary.
//!
//! The checks that build rather than run a fabric (clippy, docs, arm, fuzz) run as one process at
//! the lowest CPU priority beside the tests (`cargo xtask beside`): the tests leave CPU idle
//! while they wait on timeouts and lost packets, and those builds fill it.

use std::{
    io::{BufRead as _, BufReader},
    os::unix::process::CommandExt as _,
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
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

/// What `cargo xtask beside` runs.
#[derive(Args)]
pub struct BesideOptions {
    /// Seconds each cargo fuzz target runs (0: none)
    #[arg(long, default_value_t = 15)]
    pub fuzz_seconds: u64,
    /// Only the fuzz targets (a filtered test run skips the docs and the Arm side)
    #[arg(long)]
    pub fuzz_only: bool,
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
    let beside = BesideOptions {
        fuzz_seconds: o.fuzz_seconds,
        fuzz_only: !o.args.is_empty(),
    };
    let wanted = !beside.fuzz_only || beside.fuzz_seconds > 0;
    let mut lane = None;
    let tests = phases.time("cargo test", || {
        cargo_test(o, wanted.then_some(&beside), &mut lane)
    });
    let checks = lane.map(|lane| {
        phases
            .time("after the tests, beside", || lane.finish())
            .map(|took| {
                phases.beside("clippy, docs, arm, fuzz", took);
            })
    });
    tests?;
    checks.transpose()?;
    Ok(())
}

/// `cargo xtask beside`: the docs, the Arm side and the fuzz targets, each phase timed.
pub fn beside(o: &BesideOptions) -> Result<()> {
    let mut phases = Phases::default();
    let result = run_beside(o, &mut phases);
    println!("{}", phases.summary());
    result
}

fn run_beside(o: &BesideOptions, phases: &mut Phases) -> Result<()> {
    // The lints, the crates' docs (innet-lab's and innet-client's are their manuals) and
    // the Arm side, when the whole suite runs (a filter picks tests of this machine).
    if !o.fuzz_only {
        phases.time("clippy", || {
            exec(cargo().current_dir(workspace()).args([
                "clippy",
                "--workspace",
                "--exclude",
                "innet-ebpf",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]))
        })?;
        println!("clippy: every crate, its tests and tools included, without a warning");
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

/// `cargo xtask beside` at nice 19, its output kept in a file and shown when it ends.
struct SideLane {
    child: Child,
    log: std::path::PathBuf,
    started: Instant,
}

impl SideLane {
    fn spawn(o: &BesideOptions) -> Result<Self> {
        let log = workspace().join("target/xtask-beside.log");
        let file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut c = Command::new("nice");
        c.args(["-n", "19"])
            .arg(std::env::current_exe().context("this xtask's path")?)
            .arg("beside")
            .arg(format!("--fuzz-seconds={}", o.fuzz_seconds))
            .args(o.fuzz_only.then_some("--fuzz-only"))
            .current_dir(workspace())
            .stdout(file.try_clone()?)
            .stderr(file);
        let child = c.spawn().with_context(|| format!("spawning {c:?}"))?;
        Ok(Self {
            child,
            log,
            started: Instant::now(),
        })
    }

    /// Waits for the lane, prints its output; its whole time.
    fn finish(mut self) -> Result<Duration> {
        let status = self.child.wait().context("waiting for `xtask beside`")?;
        let took = self.started.elapsed();
        println!("     Ran docs, arm and fuzz beside the tests (output follows)");
        print!(
            "{}",
            std::fs::read_to_string(&self.log).unwrap_or_else(|e| format!(
                "(its log {} is unreadable: {e})\n",
                self.log.display()
            ))
        );
        if !status.success() {
            bail!(
                "the checks beside the tests failed ({status}): see the output above or {}",
                self.log.display()
            );
        }
        Ok(took)
    }
}

/// The reliability campaign's short form: the longest test (about 5 minutes), mostly
/// waiting on lost packets' timeouts (5–20 % of the CPUs), so it runs beside the others.
const CAMPAIGN: (&str, &str) = (
    "campaign_short",
    "short_campaign_has_no_wrong_result_hang_or_leak",
);

/// How long `cargo test` may run before the tests still running are named and killed: a
/// hang fails the run with its name, well inside CI's 90 minutes, instead of timing CI out
/// (`XTASK_TEST_DEADLINE_SECS` overrides it).
const TEST_DEADLINE: Duration = Duration::from_mins(50);

fn test_deadline() -> Duration {
    std::env::var("XTASK_TEST_DEADLINE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(TEST_DEADLINE, Duration::from_secs)
}

/// Kills process group `pgid` (the `cargo test` run and its test binaries) once `deadline`
/// has passed, unless `done` is set first; sets `fired` when it killed.
fn watchdog(pgid: u32, deadline: Duration, done: Arc<AtomicBool>, fired: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let start = Instant::now();
        while start.elapsed() < deadline {
            if done.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        if !done.load(Ordering::Relaxed) {
            fired.store(true, Ordering::Relaxed);
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{pgid}")])
                .status();
        }
    });
}

/// `cargo test` over the workspace, its output passed through and its counts summed. On a
/// whole run the campaign's test runs in a lane of its own beside the rest (its output
/// follows theirs); every test binary is built before either starts. The checks `beside`
/// asks for start in `lane` once the first test binary runs (cargo has let go of the build
/// directory's lock by then).
fn cargo_test(
    o: &Options,
    beside: Option<&BesideOptions>,
    side_lane: &mut Option<SideLane>,
) -> Result<()> {
    let test = |extra: &[&str]| {
        let mut c = cargo();
        c.current_dir(workspace())
            .args([
                "test",
                "--workspace",
                "--exclude",
                "innet-ebpf",
                "--no-fail-fast",
            ])
            .args(extra)
            .env("RUST_BACKTRACE", "1");
        c
    };
    let campaign = if o.args.is_empty() {
        exec(&mut test(&["--no-run"]))?;
        Some(spawn_lane(&campaign_binary()?)?)
    } else {
        None
    };
    let filter: Vec<String> = match &campaign {
        Some(_) => vec!["--".into(), "--skip".into(), CAMPAIGN.1.into()],
        None if o.args.is_empty() => vec![],
        None => [vec!["--".to_owned()], o.args.clone()].concat(),
    };
    let filter: Vec<&str> = filter.iter().map(String::as_str).collect();
    let mut child = test(&filter)
        .stdout(Stdio::piped())
        // Its own process group, so that the watchdog can kill the test binaries too.
        .process_group(0)
        .spawn()
        .context("spawning cargo test")?;
    let (done, fired) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let deadline = test_deadline();
    watchdog(child.id(), deadline, done.clone(), fired.clone());
    // libtest's "… has been running for over 60 seconds": who to name if it comes to that.
    let mut slow: Vec<String> = vec![];
    let mut counts = Counts::default();
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line.context("reading cargo test output")?;
        if let Some(name) = line
            .strip_prefix("test ")
            .and_then(|l| l.strip_suffix(" has been running for over 60 seconds"))
        {
            slow.push(name.to_owned());
        }
        // cargo's own `Running <binary>` lines go to stderr; a test binary's first line on
        // stdout is `running N tests`.
        if side_lane.is_none()
            && line.starts_with("running ")
            && let Some(b) = beside
        {
            *side_lane = Some(SideLane::spawn(b)?);
        }
        println!("{line}");
        counts.read(&line);
    }
    let status = child.wait().context("waiting for cargo test")?;
    done.store(true, Ordering::Relaxed);
    if fired.load(Ordering::Relaxed) {
        bail!(
            "the tests ran past {} s and were killed; those that had run over a minute: [{}]",
            deadline.as_secs(),
            slow.join(", ")
        );
    }
    if side_lane.is_none()
        && let Some(b) = beside
    {
        *side_lane = Some(SideLane::spawn(b)?);
    }
    let campaign_ok = match campaign {
        Some(handle) => {
            let (ok, lines) = handle
                .join()
                .map_err(|_| anyhow::anyhow!("the campaign lane panicked"))??;
            println!("     Running tests/{}.rs (in its own lane)", CAMPAIGN.0);
            for line in &lines {
                println!("{line}");
                counts.read(line);
            }
            ok
        }
        None => true,
    };
    println!("tests: {} passed, {} failed", counts.passed, counts.failed);
    if !status.success() || !campaign_ok || counts.failed > 0 {
        bail!("tests failed ({status})");
    }
    if counts.passed == 0 {
        bail!("no test ran");
    }
    Ok(())
}

#[derive(Default)]
struct Counts {
    passed: u64,
    failed: u64,
}

impl Counts {
    fn read(&mut self, line: &str) {
        if let Some(rest) = line.strip_prefix("test result: ") {
            self.passed += count(rest, " passed");
            self.failed += count(rest, " failed");
        }
    }
}

/// The built campaign test binary, as cargo names it.
fn campaign_binary() -> Result<std::path::PathBuf> {
    let out = cargo()
        .current_dir(workspace())
        .args([
            "test",
            "-p",
            "innet-tests",
            "--test",
            CAMPAIGN.0,
            "--no-run",
        ])
        .arg("--message-format=json")
        .output()
        .context("asking cargo for the campaign's test binary")?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter(|l| l.contains(CAMPAIGN.0))
        .find_map(|l| {
            let (_, rest) = l.split_once("\"executable\":\"")?;
            rest.split_once('"')
                .map(|(path, _)| std::path::PathBuf::from(path))
        })
        .context("cargo named no executable for the campaign's test")
}

type Lane = std::thread::JoinHandle<Result<(bool, Vec<String>)>>;

/// Runs one test binary on a thread of its own; its success and output lines.
fn spawn_lane(exe: &std::path::Path) -> Result<Lane> {
    let child = Command::new(exe)
        .current_dir(workspace().join("tests"))
        .env("RUST_BACKTRACE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawning {}", exe.display()))?;
    Ok(std::thread::spawn(move || {
        let out = child
            .wait_with_output()
            .context("waiting for the campaign")?;
        let lines = String::from_utf8_lossy(&out.stdout)
            .lines()
            .chain(String::from_utf8_lossy(&out.stderr).lines())
            .map(str::to_owned)
            .collect();
        Ok((out.status.success(), lines))
    }))
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
