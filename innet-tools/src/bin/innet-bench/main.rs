//! `cargo xtask bench`: allreduce latency sweeps on namespace fabrics (every mode side by
//! side), osu_allreduce under mpirun with and without innet's interposer, the XDP cost per
//! packet and aggregation throughput through `BPF_PROG_TEST_RUN`.
//! Writes `bench.json`, `report.md` and the plots into `--out`; fails when any result was
//! wrong. `--render FILE` re-renders the report and plots of an earlier run.

use std::{
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant},
};

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use innet::loader::XdpMode;
use innet_client::Mode;
use innet_common::{
    group::DEFAULT_WINDOW,
    proto::{Dtype, Op},
};
use innet_lab::{mpi::Flavour, shaping::LinkRate};
use innet_tools::bench::{
    Results, STANDARD_MTU,
    apps::{self, App, AppSize, AppSweep},
    barrier, breakdown, bystander,
    cpu::BpfStats,
    latency::{self, Depth, Sweep},
    machine::Machine,
    mpi::{self, MpiSweep},
    osu::{self, OsuSweep},
    overlap::{self, OverlapSweep},
    plot,
    side_by_side::Run,
    tables,
    xdp_cost::{Bench, Runs},
};

mod cli;

use cli::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    innet_lab::tear_down_on_signals("innet-bench");
    if let Some(Err(e)) = cli.osu().map(|o| o.check()) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    if cli.render.is_none()
        && let Some(Err(e)) = cli.apps().map(|a| a.check())
    {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    if let Err(e) = cli.check_fabrics() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    if let Err(e) = std::fs::create_dir_all(&cli.out) {
        eprintln!("error: cannot create {}: {e}", cli.out.display());
        return ExitCode::FAILURE;
    }
    let results = if let Some(file) = &cli.render {
        match innet_lab::read_json::<Results>(file, "bench.json") {
            Ok(r) => r,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        measure(&cli)
    };
    write(&cli, &results)
}

/// The goodput sweeps (the first one's shaped fabrics checked with TCP before its runs),
/// then plain OpenMPI at each of their MTUs.
fn goodput(cli: &Cli, results: &mut Results) {
    let sweeps = cli.goodput();
    let mpi_sweeps = cli.goodput_mpi();
    let mpi_runs = mpi_sweeps.iter().map(|s| s.nodes.len() as u64).sum::<u64>();
    let bar = progress(sweeps.iter().map(Sweep::steps).sum::<u64>() + mpi_runs);
    // The kernel times innet's XDP programs for the cases' profiles, then the old
    // setting is back.
    let stats = BpfStats::enable();
    if !stats.enabled {
        eprintln!("warning: kernel.bpf_stats_enabled cannot be set: no XDP time per packet");
    }
    for (k, goodput) in sweeps.iter().enumerate() {
        // The first sweep's fabrics, before its runs: the links checked with TCP.
        if k == 0 && goodput.link_rate.is_some() {
            let (rows, checks) = latency::run_checking_links(goodput, &bar);
            results.goodput.extend(rows);
            results.link_checks = checks;
        } else {
            results.goodput.extend(latency::run(goodput, &bar));
        }
    }
    drop(stats);
    for like in &mpi_sweeps {
        for &nodes in &like.nodes {
            results
                .goodput
                .extend(mpi::goodput(like, nodes, &cli.out.join("mpi"), &bar));
        }
    }
    bar.finish_with_message("goodput sweep done");
}

fn measure(cli: &Cli) -> Results {
    innet_lab::require_root();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "error".into()))
        .with_writer(std::io::stderr)
        .try_init();
    let sweep = cli.sweep();
    let runs = cli.runs();
    let mut results = Results {
        machine: Machine::this(),
        settings: std::env::args().skip(1).collect::<Vec<_>>().join(" "),
        ..Results::default()
    };
    let start = Instant::now();
    if !cli.no_xdp {
        // First, while nothing else runs on the machine.
        eprintln!("XDP cost per packet and throughput (BPF_PROG_TEST_RUN) …");
        let mut bench = Bench::load();
        results.xdp = bench.per_packet(runs);
        results.throughput = bench.throughput(runs, 256);
        results.programs = bench.programs();
    }
    if !cli.no_latency {
        let bar = progress(sweep.steps());
        results.latency = latency::run(&sweep, &bar);
        bar.finish_with_message("latency sweep done");
    }
    if !cli.no_goodput {
        goodput(cli, &mut results);
    }
    if !cli.no_mpi {
        let sweep = cli.mpi();
        let bar = progress(sweep.steps());
        (results.mpi, results.cutover.mpi) = mpi::run(&sweep, &cli.out.join("mpi"), &bar);
        bar.finish_with_message("mpirun runs done");
    }
    if let Some(sweep) = cli.osu() {
        let bar = progress(sweep.steps());
        results.osu = osu::run(&sweep, &cli.out.join("osu"), &bar);
        bar.finish_with_message("OSU runs done");
    }
    if let Some(sweep) = cli.apps() {
        let bar = progress(sweep.steps());
        results.apps = apps::run(&sweep, &cli.out.join("apps"), &bar);
        bar.finish_with_message("application runs done");
    }
    if let Some(sweep) = cli.overlap() {
        let bar = progress(sweep.steps());
        results.overlap = overlap::run(&sweep, &cli.out.join("overlap"), &bar);
        bar.finish_with_message("overlap runs done");
    }
    if let Some((shapes, iterations)) = cli.barrier() {
        let bar = progress((Run::ALL.len() * shapes.len()) as u64);
        results.barrier = barrier::run(&shapes, iterations, &cli.out.join("barrier"), &bar);
        bar.finish_with_message("barrier runs done");
    }
    if !cli.no_breakdown {
        let (nodes, calls) = cli.breakdown();
        eprintln!("per-stage breakdown of a 4 B allreduce at {nodes:?} nodes …");
        let modes = cli
            .breakdown_modes
            .clone()
            .unwrap_or_else(|| vec![Mode::IncNode, Mode::IncNic, Mode::IncDpu]);
        results.breakdown = breakdown::run(&nodes, &modes, calls);
    }
    if !cli.no_bystander {
        eprintln!("bystander TCP through a bridge, with and without innet …");
        let (mtus, turns, seconds) = cli.bystander();
        results.bystander = bystander::run(&mtus, turns, seconds);
        let (sizes, iterations) = if cli.smoke {
            (vec![4], 20)
        } else {
            (vec![4, 256, 4096], cli.iterations.unwrap_or(2000))
        };
        eprintln!("inc-node with the switches native, then in skb mode …");
        results.switch_modes = bystander::inc_latency(&sizes, iterations);
    }
    results.cutover.library = latency::cutover_rules(&results.latency);
    eprintln!("measured in {:.0} s", start.elapsed().as_secs_f64());
    results
}

fn progress(steps: u64) -> ProgressBar {
    ProgressBar::new(steps).with_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg} (eta {eta})")
            .expect("progress template")
            .progress_chars("=> "),
    )
}

/// Writes bench.json (unless re-rendering), report.md and the plots; fails on wrong results.
fn write(cli: &Cli, results: &Results) -> ExitCode {
    let json = cli.out.join("bench.json");
    if cli.render.is_none()
        && let Err(e) = std::fs::write(&json, serde_json::to_vec_pretty(results).expect("json"))
    {
        eprintln!("error: writing {}: {e}", json.display());
        return ExitCode::FAILURE;
    }
    if cli.render.is_none() {
        let toml = cli.out.join("cutover.toml");
        let comment = format!(
            "innet's cutover table, measured by innet-bench ({}) on {}.\n\
             library: inc-node/inc-socket against the host algorithms; mpi: innet's interposer\n\
             against MPI's own allreduce over the fabric. Point the interposer at it with\n\
             cutover = \"cutover.toml\" (or INNET_MPI_CUTOVER), the library with Config::with_cutover.",
            results.settings,
            results.machine.summary()
        );
        if let Err(e) = std::fs::write(&toml, results.cutover.to_toml(&comment)) {
            eprintln!("error: writing {}: {e}", toml.display());
            return ExitCode::FAILURE;
        }
    }
    let md = tables::markdown(results);
    let md_path = cli.out.join("report.md");
    if let Err(e) = std::fs::write(&md_path, &md) {
        eprintln!("error: writing {}: {e}", md_path.display());
        return ExitCode::FAILURE;
    }
    let plots = match plot::all(&results.latency, &results.goodput, &cli.out) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: plotting: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("{}", tables::headline_table(&results.latency));
    println!(
        "wrote {}{} and {} plots",
        if cli.render.is_none() {
            format!("{}, ", json.display())
        } else {
            String::new()
        },
        md_path.display(),
        plots.len()
    );
    let (wrong, failed) = (results.wrong(), results.failed());
    if failed > 0 {
        eprintln!("error: {failed} cases did not finish (see report.md)");
    }
    if wrong > 0 {
        eprintln!("error: {wrong} wrong results or verdicts (see report.md)");
    }
    if wrong + failed > 0 {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
