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
use innet_lab::mpi::Flavour;
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
    plot, tables,
    side_by_side::Run,
    xdp_cost::{Bench, Runs},
};

#[derive(Parser, Debug)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent command-line switches"
)]
#[command(
    name = "innet-bench",
    about = "innet benchmarks: latency sweeps, XDP cost per packet"
)]
struct Cli {
    /// Where bench.json, report.md and the plots go
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// A one-minute run: 4 and 16 nodes, 1 rank per node, 3 sizes, 300 iterations
    #[arg(long, conflicts_with = "smoke")]
    quick: bool,
    /// CI's run of the plumbing: 4 nodes, 2 sizes, 20 iterations, small XDP counts
    #[arg(long)]
    smoke: bool,
    /// Node counts
    #[arg(long, value_delimiter = ',')]
    nodes: Option<Vec<usize>>,
    /// Ranks per node
    #[arg(long, value_delimiter = ',')]
    ppn: Option<Vec<usize>>,
    /// Message sizes in bytes
    #[arg(long, value_delimiter = ',')]
    sizes: Option<Vec<usize>>,
    /// Modes (host-rd is always measured: every speed-up is a ratio to it)
    #[arg(long, value_delimiter = ',')]
    modes: Option<Vec<Mode>>,
    /// Leaders' busy-poll budget in µs before they block (default: the library's)
    #[arg(long)]
    spin_us: Option<u64>,
    /// Timed iterations for sizes up to 256 B (fewer for larger ones)
    #[arg(long)]
    iterations: Option<usize>,
    /// Repeat count of the stateless XDP cases
    #[arg(long)]
    repeat: Option<u32>,
    /// Rounds of the stateful XDP cases and of the throughput runs
    #[arg(long)]
    rounds: Option<u32>,
    /// Skip the latency sweep
    #[arg(long)]
    no_latency: bool,
    /// Message sizes of the goodput sweep (float64 SUM, 1 rank per node)
    #[arg(long, value_delimiter = ',')]
    goodput_sizes: Option<Vec<usize>>,
    /// Node counts of the goodput sweep, 1 rank per node: every setting and plain OpenMPI
    /// run at each (default 4,16; `--quick`, `--smoke`: 4)
    #[arg(long, value_delimiter = ',')]
    goodput_nodes: Option<Vec<usize>>,
    /// Allreduces per size and mode of the goodput sweep
    #[arg(long)]
    goodput_iterations: Option<usize>,
    /// Modes of the goodput sweep (default: host-ring, inc-node, inc-nic)
    #[arg(long, value_delimiter = ',')]
    goodput_modes: Option<Vec<Mode>>,
    /// Link MTUs of the goodput sweep: the first runs every mode, later (jumbo) ones the
    /// in-network modes, plain OpenMPI runs at each (3506: the most one XDP buffer takes;
    /// 9000: jumbo frames of 8 KiB payloads over several, where inc-nic still falls back)
    #[arg(long, value_delimiter = ',', default_value = "1500,3506")]
    goodput_mtu: Vec<usize>,
    /// Slots per group (`innet attach --window`) of the goodput sweep, at each MTU: the
    /// default window runs every mode, wider ones the in-network modes
    #[arg(long, value_delimiter = ',', default_value = "16")]
    goodput_windows: Vec<u32>,
    /// Element types of the goodput sweep's in-network modes (SUM of each); plain OpenMPI
    /// and `host-ring` add float64. An integer type measures what innet moves when its
    /// switches add natively, as switch hardware does, where float adds are software in BPF
    #[arg(long, value_delimiter = ',', value_parser = parse_dtype, default_value = "float64")]
    goodput_dtypes: Vec<Dtype>,
    /// Skip the goodput sweep
    #[arg(long)]
    no_goodput: bool,
    /// Leave plain OpenMPI (over the fabric, at every goodput MTU) out of the goodput sweep
    #[arg(long)]
    no_goodput_mpi: bool,
    /// Skip the XDP measurements
    #[arg(long)]
    no_xdp: bool,
    /// Message sizes of osu_allreduce under mpirun (with and without innet)
    #[arg(long, value_delimiter = ',')]
    mpi_sizes: Option<Vec<usize>>,
    /// Jobs of osu_allreduce under mpirun, NODESxPPN (multi-node launch: one daemon per
    /// node, shared memory within a node, TCP through the fabric between nodes)
    #[arg(long, value_delimiter = ',', value_parser = parse_shape)]
    mpi_shapes: Option<Vec<(usize, usize)>>,
    /// MPI implementations for osu_allreduce (openmpi, mpich)
    #[arg(long, value_delimiter = ',', value_parser = parse_flavour)]
    mpi_flavours: Option<Vec<Flavour>>,
    /// Skip osu_allreduce under mpirun
    #[arg(long)]
    no_mpi: bool,
    /// Run the real OSU benchmarks built by `cargo xtask osu` (DIR holds
    /// `<flavour>/osu_<test>`), plain MPI and MPI + innet side by side
    #[arg(long, value_name = "DIR", num_args = 0..=1, default_missing_value = "target/osu")]
    osu: Option<PathBuf>,
    /// OSU benchmarks, without `osu_`
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "iallreduce,ibarrier,ibcast,allgather,reduce_scatter"
    )]
    osu_tests: Vec<String>,
    /// Jobs of the OSU benchmarks, NODESxPPN (multi-node launch)
    #[arg(long, value_delimiter = ',', value_parser = parse_shape, default_value = "4x1,16x1")]
    osu_shapes: Vec<(usize, usize)>,
    /// OSU's message sizes, MIN:MAX (`-m`: powers of two from MIN)
    #[arg(long, value_parser = parse_range, default_value = "4:256")]
    osu_sizes: (usize, usize),
    /// OSU's timed iterations per size (`-i`)
    #[arg(long, default_value_t = 1000)]
    osu_iterations: usize,
    /// OSU's warm-up iterations per size (`-x`)
    #[arg(long, default_value_t = 100)]
    osu_warmup: usize,
    /// OSU checks every result (`-c`, untimed)
    #[arg(long)]
    osu_validate: bool,
    /// Whole applications under mpirun (multi-node launch), plain MPI and MPI + innet side
    /// by side: lammps, cg (PETSc's CG through petsc4py)
    #[arg(long, value_delimiter = ',', default_value = "lammps,cg")]
    apps: Vec<App>,
    /// Jobs of the application runs, NODESxPPN (default 4x1,16x1,4x4; `--quick`: 4x1,16x1;
    /// `--smoke`: 4x1 with small problems)
    #[arg(long, value_delimiter = ',', value_parser = parse_shape)]
    app_shapes: Option<Vec<(usize, usize)>>,
    /// Skip the application runs
    #[arg(long)]
    no_apps: bool,
    /// Grid points per side of the CG solver's Laplacian (default 256; `--smoke`: 64):
    /// smaller grids are more bound by the allreduces, as a solver at its strong-scaling
    /// limit is
    #[arg(long)]
    cg_grid: Option<usize>,
    /// Jobs of `barrier_skew` (release skew of a barrier and the cost of MPI's next call),
    /// NODESxPPN (default 4x1,16x1,4x4; `--smoke`: 4x1)
    #[arg(long, value_delimiter = ',', value_parser = parse_shape)]
    barrier_shapes: Option<Vec<(usize, usize)>>,
    /// Skip `barrier_skew`
    #[arg(long)]
    no_barrier: bool,
    /// Jobs of `nbc_overlap` (non-blocking collectives behind a spinning and a sleeping
    /// computation), NODESxPPN (default 4x1,16x1; `--smoke`: 4x1)
    #[arg(long, value_delimiter = ',', value_parser = parse_shape)]
    overlap_shapes: Option<Vec<(usize, usize)>>,
    /// Non-blocking collectives of `nbc_overlap`: iallreduce, ibcast, ireduce, ibarrier
    #[arg(long, value_delimiter = ',', default_value = "iallreduce,ibcast")]
    overlap_kinds: Vec<String>,
    /// Skip `nbc_overlap`
    #[arg(long)]
    no_overlap: bool,
    /// Node counts of the per-stage breakdown of a 4 B allreduce (1 rank per node)
    #[arg(long, value_delimiter = ',')]
    breakdown_nodes: Option<Vec<usize>>,
    /// Modes of the per-stage breakdown (default: inc-node, inc-nic, inc-dpu)
    #[arg(long, value_delimiter = ',')]
    breakdown_modes: Option<Vec<Mode>>,
    /// Skip the per-stage breakdown
    #[arg(long)]
    no_breakdown: bool,
    /// Link MTUs of the bystander runs (TCP through a bridge with and without innet)
    #[arg(long, value_delimiter = ',', default_value = "1500,9000")]
    bystander_mtus: Vec<usize>,
    /// Turns of the bystander runs (each turn runs without innet, then natively, then in
    /// skb mode)
    #[arg(long, default_value_t = 3)]
    bystander_turns: usize,
    /// Seconds of TCP per bystander run
    #[arg(long, default_value_t = 5)]
    bystander_seconds: u32,
    /// Skip the bystander runs (and inc-node with the switches in skb mode beside native)
    #[arg(long)]
    no_bystander: bool,
    /// Switch levels of the latency and goodput sweeps' fabrics: 1 (one TOR), 2 (TORs
    /// under SPINEs) or 3 (pods of TORs under aggregation switches under cores)
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=3))]
    levels: u8,
    /// Pods of a 3-level fabric (default: pods of 2 TORs of up to 8 nodes)
    #[arg(long)]
    pods: Option<usize>,
    /// Aggregation switches per pod of a 3-level fabric
    #[arg(long, default_value_t = 2)]
    aggs: usize,
    /// Core switches of a 3-level fabric
    #[arg(long, default_value_t = 2)]
    cores: usize,
    /// Re-render report.md and the plots from this bench.json (measures nothing)
    #[arg(long, value_name = "FILE")]
    render: Option<PathBuf>,
}

/// `NODESxPPN`, e.g. `16x1`.
fn parse_shape(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("{s:?} is not NODESxPPN (e.g. 16x1)");
    let (n, p) = s.split_once('x').ok_or_else(bad)?;
    let (n, p) = (n.parse().map_err(|_| bad())?, p.parse().map_err(|_| bad())?);
    if n < 2 || p < 1 {
        return Err(format!("{s:?}: at least 2 nodes and 1 rank per node"));
    }
    Ok((n, p))
}

/// `MIN:MAX`, e.g. `4:256`.
fn parse_range(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("{s:?} is not MIN:MAX bytes (e.g. 4:256)");
    let (a, b) = s.split_once(':').ok_or_else(bad)?;
    let (a, b) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
    if a == 0 || a > b {
        return Err(format!("{s:?}: need 0 < MIN ≤ MAX"));
    }
    Ok((a, b))
}

fn parse_dtype(s: &str) -> Result<Dtype, String> {
    Dtype::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = Dtype::ALL.iter().map(|d| d.name()).collect();
        format!(
            "unknown element type {s:?}: use one of {}",
            names.join(", ")
        )
    })
}

fn parse_flavour(s: &str) -> Result<Flavour, String> {
    Flavour::ALL
        .into_iter()
        .find(|f| f.name() == s)
        .ok_or_else(|| format!("unknown MPI {s:?}: use openmpi or mpich"))
}

const FULL_SIZES: [usize; 10] = [4, 8, 16, 32, 64, 128, 256, 1024, 4096, 65_536];
const GOODPUT_SIZES: [usize; 5] = [65_536, 256 << 10, 1 << 20, 4 << 20, 16 << 20];
const ALL_MODES: [Mode; 6] = [
    Mode::HostRd,
    Mode::HostRing,
    Mode::IncNode,
    Mode::IncSocket,
    Mode::IncNic,
    Mode::IncDpu,
];

impl Cli {
    /// The sweeps' fabric depth.
    fn fabric(&self) -> Depth {
        Depth {
            levels: self.levels.into(),
            pods: self.pods,
            aggs: self.aggs,
            cores: self.cores,
        }
    }

    /// Every fabric the latency and goodput sweeps build can be built.
    fn check_fabrics(&self) -> Result<(), String> {
        let sweeps = std::iter::once(self.sweep())
            .chain(self.goodput())
            .chain(self.goodput_mpi());
        for n in sweeps.flat_map(|s| s.nodes) {
            self.fabric().shape(n)?;
        }
        Ok(())
    }

    fn sweep(&self) -> Sweep {
        let (nodes, ppn, sizes, iterations) = if self.smoke {
            (vec![4], vec![1, 2], vec![4, 1024], 20)
        } else if self.quick {
            (vec![4, 16], vec![1], vec![4, 256, 4096], 300)
        } else {
            (vec![4, 9, 16], vec![1, 2, 4], FULL_SIZES.to_vec(), 10_000)
        };
        let mut modes = self.modes.clone().unwrap_or_else(|| ALL_MODES.to_vec());
        if !modes.contains(&Mode::HostRd) {
            modes.insert(0, Mode::HostRd);
        }
        Sweep {
            nodes: self.nodes.clone().unwrap_or(nodes),
            ppn: self.ppn.clone().unwrap_or(ppn),
            sizes: self.sizes.clone().unwrap_or(sizes),
            modes,
            iterations: self.iterations.unwrap_or(iterations),
            op: Op::Sum,
            dtype: Dtype::I32,
            spin: self.spin_us.map(Duration::from_micros),
            mtu: None,
            window: None,
            switch_mode: XdpMode::Native,
            fabric: self.fabric(),
            profile: false,
        }
    }

    /// Long messages: float64 SUM from 64 KiB to 16 MiB, every mode that streams next to
    /// `host-ring` (the host algorithm for long messages), at each `--goodput-nodes` × 1
    /// rank per node; one sweep per link MTU and window, each case profiled.
    fn goodput(&self) -> Vec<Sweep> {
        let modes = self
            .goodput_modes
            .clone()
            .unwrap_or_else(|| vec![Mode::HostRing, Mode::IncNode, Mode::IncNic]);
        let settings = self.goodput_mtu.iter().flat_map(|&mtu| {
            self.goodput_windows.iter().flat_map(move |&w| {
                self.goodput_dtypes
                    .iter()
                    .map(move |&dtype| (mtu, w, dtype))
            })
        });
        let host = |m: &Mode| matches!(m, Mode::HostRing | Mode::HostRd);
        // Host packets are 1500 B-MTU sized whatever the links carry, and use no slots:
        // they run once, at the first MTU, in float64 like MPI.
        let hosts = self.goodput_mtu.first().map(|&mtu| Sweep {
            modes: modes.iter().copied().filter(host).collect(),
            ..self.goodput_at(mtu)
        });
        let network = settings.map(|(mtu, window, dtype)| Sweep {
            modes: modes.iter().copied().filter(|m| !host(m)).collect(),
            window: (window != DEFAULT_WINDOW).then_some(window),
            dtype,
            ..self.goodput_at(mtu)
        });
        hosts
            .into_iter()
            .chain(network)
            .filter(|s| !s.modes.is_empty())
            .collect()
    }

    /// The goodput sweep's settings at link MTU `mtu` (no modes, the default window): what
    /// plain OpenMPI runs with at that MTU.
    fn goodput_at(&self, mtu: usize) -> Sweep {
        let (nodes, sizes, iterations) = if self.smoke {
            (vec![4], vec![65_536, 1 << 20], 50)
        } else if self.quick {
            (vec![4], vec![65_536, 1 << 20, 16 << 20], 250)
        } else {
            (vec![4, 16], GOODPUT_SIZES.to_vec(), 500)
        };
        Sweep {
            nodes: self.goodput_nodes.clone().unwrap_or(nodes),
            ppn: vec![1],
            sizes: self.goodput_sizes.clone().unwrap_or(sizes),
            modes: vec![],
            iterations: self.goodput_iterations.unwrap_or(iterations),
            op: Op::Sum,
            dtype: Dtype::F64,
            spin: self.spin_us.map(Duration::from_micros),
            mtu: (mtu != STANDARD_MTU).then_some(mtu),
            window: None,
            switch_mode: XdpMode::Native,
            fabric: self.fabric(),
            profile: true,
        }
    }

    /// Plain OpenMPI's goodput settings: one per distinct goodput MTU (unless
    /// `--no-goodput-mpi`).
    fn goodput_mpi(&self) -> Vec<Sweep> {
        let mut mtus: Vec<usize> = vec![];
        for &m in &self.goodput_mtu {
            if !self.no_goodput_mpi && !mtus.contains(&m) {
                mtus.push(m);
            }
        }
        mtus.into_iter().map(|m| self.goodput_at(m)).collect()
    }

    /// osu_allreduce under OpenMPI and MPICH, plain and with the interposer.
    /// The bystander runs' MTUs, turns and seconds (`--smoke`: one second-long turn at
    /// 1500 B).
    fn bystander(&self) -> (Vec<usize>, usize, u32) {
        if self.smoke {
            (vec![STANDARD_MTU], 1, 1)
        } else {
            (
                self.bystander_mtus.clone(),
                self.bystander_turns,
                self.bystander_seconds,
            )
        }
    }

    fn mpi(&self) -> MpiSweep {
        let (sizes, iterations, shapes) = if self.smoke {
            (vec![4, 1024], 40, vec![(4, 1)])
        } else if self.quick {
            (vec![4, 256, 4096], 300, vec![(4, 1), (16, 1)])
        } else {
            (
                FULL_SIZES.to_vec(),
                1_000,
                vec![(4, 1), (8, 1), (16, 1), (4, 4)],
            )
        };
        MpiSweep {
            // MPICH's ch4 polls without yielding: oversubscribed here, it measures the
            // scheduler, not MPI (asked for by name only).
            flavours: self
                .mpi_flavours
                .clone()
                .unwrap_or_else(|| vec![Flavour::OpenMpi]),
            shapes: self.mpi_shapes.clone().unwrap_or(shapes),
            sizes: self.mpi_sizes.clone().unwrap_or(sizes),
            iterations: self.iterations.unwrap_or(iterations),
            float64: false,
        }
    }

    /// The application runs, unless `--no-apps`.
    fn apps(&self) -> Option<AppSweep> {
        if self.no_apps {
            return None;
        }
        let (shapes, size) = if self.smoke {
            (vec![(4, 1)], AppSize::SMOKE)
        } else if self.quick {
            (vec![(4, 1), (16, 1)], AppSize::FULL)
        } else {
            (vec![(4, 1), (16, 1), (4, 4)], AppSize::FULL)
        };
        Some(AppSweep {
            apps: self.apps.clone(),
            shapes: self.app_shapes.clone().unwrap_or(shapes),
            size: AppSize {
                cg_grid: self.cg_grid.unwrap_or(size.cg_grid),
                ..size
            },
        })
    }

    /// `barrier_skew`'s shapes and timed iterations, unless `--no-barrier`.
    fn barrier(&self) -> Option<(Vec<(usize, usize)>, usize)> {
        if self.no_barrier {
            return None;
        }
        let (shapes, iterations) = if self.smoke {
            (vec![(4, 1)], 50)
        } else {
            (vec![(4, 1), (16, 1), (4, 4)], 1000)
        };
        Some((self.barrier_shapes.clone().unwrap_or(shapes), iterations))
    }

    /// `nbc_overlap`'s sweep, unless `--no-overlap`.
    fn overlap(&self) -> Option<OverlapSweep> {
        if self.no_overlap {
            return None;
        }
        let (shapes, sizes, iterations) = if self.smoke {
            (vec![(4, 1)], (4, 64), 40)
        } else {
            (vec![(4, 1), (16, 1)], (4, 256), 1000)
        };
        Some(OverlapSweep {
            shapes: self.overlap_shapes.clone().unwrap_or(shapes),
            kinds: self.overlap_kinds.clone(),
            sizes,
            iterations,
        })
    }

    /// The real OSU benchmarks, when asked for (`--osu`).
    fn osu(&self) -> Option<OsuSweep> {
        Some(OsuSweep {
            dir: self.osu.clone()?,
            flavours: self.mpi().flavours,
            tests: self.osu_tests.clone(),
            shapes: self.osu_shapes.clone(),
            sizes: self.osu_sizes,
            iterations: self.osu_iterations,
            warmup: self.osu_warmup,
            validate: self.osu_validate,
        })
    }

    /// Node counts and traced calls of the per-stage breakdown.
    fn breakdown(&self) -> (Vec<usize>, usize) {
        let (nodes, calls) = if self.smoke {
            (vec![4], 100)
        } else {
            (vec![4, 16], 2_000)
        };
        (self.breakdown_nodes.clone().unwrap_or(nodes), calls)
    }

    fn runs(&self) -> Runs {
        let (repeat, rounds, groups): (u32, u32, &'static [usize]) = if self.smoke {
            (10_000, 200, &[1, 64])
        } else if self.quick {
            (200_000, 2_000, &[1, 64, 256])
        } else {
            (1_000_000, 20_000, &[1, 16, 256])
        };
        Runs {
            repeat: self.repeat.unwrap_or(repeat),
            rounds: self.rounds.unwrap_or(rounds),
            groups,
        }
    }
}

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
        for goodput in &sweeps {
            results.goodput.extend(latency::run(goodput, &bar));
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
