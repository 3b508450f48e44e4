//! innet-bench's command line: what to measure, and the sweeps it makes of it.

use super::{
    App, AppSize, AppSweep, DEFAULT_WINDOW, Depth, Dtype, Duration, Flavour, LinkRate, Mode,
    MpiSweep, Op, OsuSweep, OverlapSweep, Parser, PathBuf, Runs, STANDARD_MTU, Sweep, XdpMode,
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
pub(crate) struct Cli {
    /// Where bench.json, report.md and the plots go
    #[arg(long, default_value = "target/bench")]
    pub(crate) out: PathBuf,
    /// A one-minute run: 4 and 16 nodes, 1 rank per node, 3 sizes, 300 iterations
    #[arg(long, conflicts_with = "smoke")]
    pub(crate) quick: bool,
    /// CI's run of the plumbing: 4 nodes, 2 sizes, 20 iterations, small XDP counts
    #[arg(long)]
    pub(crate) smoke: bool,
    /// Node counts
    #[arg(long, value_delimiter = ',')]
    pub(crate) nodes: Option<Vec<usize>>,
    /// Ranks per node
    #[arg(long, value_delimiter = ',')]
    pub(crate) ppn: Option<Vec<usize>>,
    /// Message sizes in bytes
    #[arg(long, value_delimiter = ',')]
    pub(crate) sizes: Option<Vec<usize>>,
    /// Modes (host-rd is always measured: every speed-up is a ratio to it)
    #[arg(long, value_delimiter = ',')]
    pub(crate) modes: Option<Vec<Mode>>,
    /// Leaders' busy-poll budget in µs before they block (default: the library's)
    #[arg(long)]
    pub(crate) spin_us: Option<u64>,
    /// Timed iterations for sizes up to 256 B (fewer for larger ones)
    #[arg(long)]
    pub(crate) iterations: Option<usize>,
    /// Repeat count of the stateless XDP cases
    #[arg(long)]
    pub(crate) repeat: Option<u32>,
    /// Rounds of the stateful XDP cases and of the throughput runs
    #[arg(long)]
    pub(crate) rounds: Option<u32>,
    /// Skip the latency sweep
    #[arg(long)]
    pub(crate) no_latency: bool,
    /// Message sizes of the goodput sweep (float64 SUM, 1 rank per node)
    #[arg(long, value_delimiter = ',')]
    pub(crate) goodput_sizes: Option<Vec<usize>>,
    /// Node counts of the goodput sweep, 1 rank per node: every setting and plain OpenMPI
    /// run at each (default 4,16; `--quick`, `--smoke`: 4)
    #[arg(long, value_delimiter = ',')]
    pub(crate) goodput_nodes: Option<Vec<usize>>,
    /// Allreduces per size and mode of the goodput sweep
    #[arg(long)]
    pub(crate) goodput_iterations: Option<usize>,
    /// Modes of the goodput sweep (default: host-ring, inc-node, inc-nic)
    #[arg(long, value_delimiter = ',')]
    pub(crate) goodput_modes: Option<Vec<Mode>>,
    /// Link MTUs of the goodput sweep: the first runs every mode, later (jumbo) ones the
    /// in-network modes, plain OpenMPI runs at each (3506: the most one XDP buffer takes;
    /// 9000: jumbo frames of 8 KiB payloads over several, where inc-nic still falls back)
    #[arg(long, value_delimiter = ',', default_value = "1500,3506")]
    pub(crate) goodput_mtu: Vec<usize>,
    /// Shape every link of the latency, goodput and osu_allreduce (`--mpi-*`) fabrics
    /// (innet's modes, the host algorithms and OpenMPI alike) to this rate in both
    /// directions, e.g. 200mbit: the links bind, as a real cluster's do, rather than the two
    /// CPUs. The goodput sweep checks each fabric's links with TCP first
    #[arg(long)]
    pub(crate) link_rate: Option<LinkRate>,
    /// Every link of the latency and goodput sweeps' fabrics drops this percentage of the
    /// INC data packets it carries, each way (contributions, partials, results, the host
    /// algorithms' messages; MPI's TCP is never touched), e.g. 1 with `--link-rate`: what
    /// innet keeps of its goodput on a lossy binding link
    #[arg(long, value_parser = parse_percent)]
    pub(crate) link_loss: Option<f64>,
    /// Slots per group (`innet attach --window`) of the goodput sweep, at each MTU: the
    /// default window runs every mode, wider ones the in-network modes
    #[arg(long, value_delimiter = ',', default_value = "16")]
    pub(crate) goodput_windows: Vec<u32>,
    /// Element types of the goodput sweep's in-network modes (SUM of each); plain OpenMPI
    /// and `host-ring` add float64. An integer type measures what innet moves when its
    /// switches add natively, as switch hardware does, where float adds are software in BPF
    #[arg(long, value_delimiter = ',', value_parser = parse_dtype, default_value = "float64")]
    pub(crate) goodput_dtypes: Vec<Dtype>,
    /// Skip the goodput sweep
    #[arg(long)]
    pub(crate) no_goodput: bool,
    /// Leave plain OpenMPI (over the fabric, at every goodput MTU) out of the goodput sweep
    #[arg(long)]
    pub(crate) no_goodput_mpi: bool,
    /// Skip the XDP measurements
    #[arg(long)]
    pub(crate) no_xdp: bool,
    /// Message sizes of osu_allreduce under mpirun (with and without innet)
    #[arg(long, value_delimiter = ',')]
    pub(crate) mpi_sizes: Option<Vec<usize>>,
    /// Jobs of osu_allreduce under mpirun, NODESxPPN (multi-node launch: one daemon per
    /// node, shared memory within a node, TCP through the fabric between nodes)
    #[arg(long, value_delimiter = ',', value_parser = parse_shape)]
    pub(crate) mpi_shapes: Option<Vec<(usize, usize)>>,
    /// MPI implementations for osu_allreduce (openmpi, mpich)
    #[arg(long, value_delimiter = ',', value_parser = parse_flavour)]
    pub(crate) mpi_flavours: Option<Vec<Flavour>>,
    /// Skip osu_allreduce under mpirun
    #[arg(long)]
    pub(crate) no_mpi: bool,
    /// Run the real OSU benchmarks built by `cargo xtask osu` (DIR holds
    /// `<flavour>/osu_<test>`), plain MPI and MPI + innet side by side
    #[arg(long, value_name = "DIR", num_args = 0..=1, default_missing_value = "target/osu")]
    pub(crate) osu: Option<PathBuf>,
    /// OSU benchmarks, without `osu_`
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "iallreduce,ibarrier,ibcast,allgather,reduce_scatter"
    )]
    pub(crate) osu_tests: Vec<String>,
    /// Jobs of the OSU benchmarks, NODESxPPN (multi-node launch)
    #[arg(long, value_delimiter = ',', value_parser = parse_shape, default_value = "4x1,16x1")]
    pub(crate) osu_shapes: Vec<(usize, usize)>,
    /// OSU's message sizes, MIN:MAX (`-m`: powers of two from MIN)
    #[arg(long, value_parser = parse_range, default_value = "4:256")]
    pub(crate) osu_sizes: (usize, usize),
    /// OSU's timed iterations per size (`-i`)
    #[arg(long, default_value_t = 1000)]
    pub(crate) osu_iterations: usize,
    /// OSU's warm-up iterations per size (`-x`)
    #[arg(long, default_value_t = 100)]
    pub(crate) osu_warmup: usize,
    /// OSU checks every result (`-c`, untimed)
    #[arg(long)]
    pub(crate) osu_validate: bool,
    /// Whole applications under mpirun (multi-node launch), plain MPI and MPI + innet side
    /// by side: lammps, cg (PETSc's CG through petsc4py)
    #[arg(long, value_delimiter = ',', default_value = "lammps,cg")]
    pub(crate) apps: Vec<App>,
    /// Jobs of the application runs, NODESxPPN (default 4x1,16x1,4x4; `--quick`: 4x1,16x1;
    /// `--smoke`: 4x1 with small problems)
    #[arg(long, value_delimiter = ',', value_parser = parse_shape)]
    pub(crate) app_shapes: Option<Vec<(usize, usize)>>,
    /// Skip the application runs
    #[arg(long)]
    pub(crate) no_apps: bool,
    /// Grid points per side of the CG solver's Laplacian (default 256; `--smoke`: 64):
    /// smaller grids are more bound by the allreduces, as a solver at its strong-scaling
    /// limit is
    #[arg(long)]
    pub(crate) cg_grid: Option<usize>,
    /// Jobs of `barrier_skew` (release skew of a barrier and the cost of MPI's next call),
    /// NODESxPPN (default 4x1,16x1,4x4; `--smoke`: 4x1)
    #[arg(long, value_delimiter = ',', value_parser = parse_shape)]
    pub(crate) barrier_shapes: Option<Vec<(usize, usize)>>,
    /// Skip `barrier_skew`
    #[arg(long)]
    pub(crate) no_barrier: bool,
    /// Jobs of `nbc_overlap` (non-blocking collectives behind a spinning and a sleeping
    /// computation), NODESxPPN (default 4x1,16x1; `--smoke`: 4x1)
    #[arg(long, value_delimiter = ',', value_parser = parse_shape)]
    pub(crate) overlap_shapes: Option<Vec<(usize, usize)>>,
    /// Non-blocking collectives of `nbc_overlap`: iallreduce, ibcast, ireduce, ibarrier
    #[arg(long, value_delimiter = ',', default_value = "iallreduce,ibcast")]
    pub(crate) overlap_kinds: Vec<String>,
    /// Skip `nbc_overlap`
    #[arg(long)]
    pub(crate) no_overlap: bool,
    /// Node counts of the per-stage breakdown of a 4 B allreduce (1 rank per node)
    #[arg(long, value_delimiter = ',')]
    pub(crate) breakdown_nodes: Option<Vec<usize>>,
    /// Modes of the per-stage breakdown (default: inc-node, inc-nic, inc-dpu)
    #[arg(long, value_delimiter = ',')]
    pub(crate) breakdown_modes: Option<Vec<Mode>>,
    /// Skip the per-stage breakdown
    #[arg(long)]
    pub(crate) no_breakdown: bool,
    /// Link MTUs of the bystander runs (TCP through a bridge with and without innet)
    #[arg(long, value_delimiter = ',', default_value = "1500,9000")]
    pub(crate) bystander_mtus: Vec<usize>,
    /// Turns of the bystander runs (each turn runs without innet, then natively, then in
    /// skb mode)
    #[arg(long, default_value_t = 3)]
    pub(crate) bystander_turns: usize,
    /// Seconds of TCP per bystander run
    #[arg(long, default_value_t = 5)]
    pub(crate) bystander_seconds: u32,
    /// Skip the bystander runs (and inc-node with the switches in skb mode beside native)
    #[arg(long)]
    pub(crate) no_bystander: bool,
    /// Switch levels of the latency and goodput sweeps' fabrics: 1 (one TOR), 2 (TORs
    /// under SPINEs) or 3 (pods of TORs under aggregation switches under cores)
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=3))]
    pub(crate) levels: u8,
    /// Pods of a 3-level fabric (default: pods of 2 TORs of up to 8 nodes)
    #[arg(long)]
    pub(crate) pods: Option<usize>,
    /// Aggregation switches per pod of a 3-level fabric
    #[arg(long, default_value_t = 2)]
    pub(crate) aggs: usize,
    /// Core switches of a 3-level fabric
    #[arg(long, default_value_t = 2)]
    pub(crate) cores: usize,
    /// Re-render report.md and the plots from this bench.json (measures nothing)
    #[arg(long, value_name = "FILE")]
    pub(crate) render: Option<PathBuf>,
}

/// `NODESxPPN`, e.g. `16x1`.
pub(crate) fn parse_shape(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("{s:?} is not NODESxPPN (e.g. 16x1)");
    let (n, p) = s.split_once('x').ok_or_else(bad)?;
    let (n, p) = (n.parse().map_err(|_| bad())?, p.parse().map_err(|_| bad())?);
    if n < 2 || p < 1 {
        return Err(format!("{s:?}: at least 2 nodes and 1 rank per node"));
    }
    Ok((n, p))
}

/// `MIN:MAX`, e.g. `4:256`.
pub(crate) fn parse_range(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("{s:?} is not MIN:MAX bytes (e.g. 4:256)");
    let (a, b) = s.split_once(':').ok_or_else(bad)?;
    let (a, b) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
    if a == 0 || a > b {
        return Err(format!("{s:?}: need 0 < MIN ≤ MAX"));
    }
    Ok((a, b))
}

/// A percentage above 0 and below 100, e.g. `1` or `0.5`.
pub(crate) fn parse_percent(s: &str) -> Result<f64, String> {
    match s.trim_end_matches('%').parse::<f64>() {
        Ok(p) if p > 0.0 && p < 100.0 => Ok(p),
        _ => Err(format!(
            "{s:?} is no percentage above 0 and below 100 (e.g. 1 for one packet in a hundred)"
        )),
    }
}

pub(crate) fn parse_dtype(s: &str) -> Result<Dtype, String> {
    Dtype::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = Dtype::ALL.iter().map(|d| d.name()).collect();
        format!(
            "unknown element type {s:?}: use one of {}",
            names.join(", ")
        )
    })
}

pub(crate) fn parse_flavour(s: &str) -> Result<Flavour, String> {
    Flavour::ALL
        .into_iter()
        .find(|f| f.name() == s)
        .ok_or_else(|| format!("unknown MPI {s:?}: use openmpi or mpich"))
}

pub(crate) const FULL_SIZES: [usize; 10] = [4, 8, 16, 32, 64, 128, 256, 1024, 4096, 65_536];
pub(crate) const GOODPUT_SIZES: [usize; 5] = [65_536, 256 << 10, 1 << 20, 4 << 20, 16 << 20];
pub(crate) const ALL_MODES: [Mode; 6] = [
    Mode::HostRd,
    Mode::HostRing,
    Mode::IncNode,
    Mode::IncSocket,
    Mode::IncNic,
    Mode::IncDpu,
];

impl Cli {
    /// The sweeps' fabric depth.
    pub(crate) fn fabric(&self) -> Depth {
        Depth {
            levels: self.levels.into(),
            pods: self.pods,
            aggs: self.aggs,
            cores: self.cores,
        }
    }

    /// Every fabric the latency and goodput sweeps build can be built.
    pub(crate) fn check_fabrics(&self) -> Result<(), String> {
        let sweeps = std::iter::once(self.sweep())
            .chain(self.goodput())
            .chain(self.goodput_mpi());
        for n in sweeps.flat_map(|s| s.nodes) {
            self.fabric().shape(n)?;
        }
        Ok(())
    }

    pub(crate) fn sweep(&self) -> Sweep {
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
            link_rate: self.link_rate,
            link_loss: self.link_loss.map(|p| p / 100.0),
            window: None,
            switch_mode: XdpMode::Native,
            fabric: self.fabric(),
            profile: false,
        }
    }

    /// Long messages: float64 SUM from 64 KiB to 16 MiB, every mode that streams next to
    /// `host-ring` (the host algorithm for long messages), at each `--goodput-nodes` × 1
    /// rank per node; one sweep per link MTU and window, each case profiled.
    pub(crate) fn goodput(&self) -> Vec<Sweep> {
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
    pub(crate) fn goodput_at(&self, mtu: usize) -> Sweep {
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
            link_rate: self.link_rate,
            link_loss: self.link_loss.map(|p| p / 100.0),
            window: None,
            switch_mode: XdpMode::Native,
            fabric: self.fabric(),
            profile: true,
        }
    }

    /// Plain OpenMPI's goodput settings: one per distinct goodput MTU (unless
    /// `--no-goodput-mpi`).
    pub(crate) fn goodput_mpi(&self) -> Vec<Sweep> {
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
    pub(crate) fn bystander(&self) -> (Vec<usize>, usize, u32) {
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

    pub(crate) fn mpi(&self) -> MpiSweep {
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
            link_rate: self.link_rate,
        }
    }

    /// The application runs, unless `--no-apps`.
    pub(crate) fn apps(&self) -> Option<AppSweep> {
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
    pub(crate) fn barrier(&self) -> Option<(Vec<(usize, usize)>, usize)> {
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
    pub(crate) fn overlap(&self) -> Option<OverlapSweep> {
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
    pub(crate) fn osu(&self) -> Option<OsuSweep> {
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
    pub(crate) fn breakdown(&self) -> (Vec<usize>, usize) {
        let (nodes, calls) = if self.smoke {
            (vec![4], 100)
        } else {
            (vec![4, 16], 2_000)
        };
        (self.breakdown_nodes.clone().unwrap_or(nodes), calls)
    }

    pub(crate) fn runs(&self) -> Runs {
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
