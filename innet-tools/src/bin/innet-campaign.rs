//! `cargo xtask campaign`: the reliability campaign on a wired namespace fabric — loss,
//! duplication and reordering at several rates in every mode, group churn, and (on its own)
//! a long soak. Writes `campaign.json` and `report.md` into `--out`; exits non-zero when
//! any result was wrong, any call hung or failed, or a group was left behind.
//!
//! The loss settings run on two fabrics (`--levels`): the two-level one of every mode, and
//! a three-level one (TORs, aggregation switches, cores) whose host links, level-1 uplinks
//! (TOR–aggregation) and level-2 uplinks (aggregation–core) take the faults in turn, in the
//! modes that reduce in the switches (`inc-node`, `inc-socket`).

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use innet_client::Mode;
use innet_common::{
    group::DEFAULT_WINDOW,
    proto::{JUMBO_MTU, STANDARD_MTU},
};
use innet_tools::{
    bench::machine::Machine,
    campaign::{
        HostileRow, LossRow, Results, churn,
        fabric::{Setting, WiredFabric},
        hostile,
        loss::{self, Fault, LossPlan, Place},
        soak, tables, vanish,
        workload::{BREADTH_CASES, CASES, Collective, LONG_MESSAGE},
    },
};

#[derive(Parser, Debug)]
#[command(name = "innet-campaign", about = "innet reliability campaign")]
struct Cli {
    /// Where campaign.json and report.md go
    #[arg(long, default_value = "target/campaign", global = true)]
    out: PathBuf,
    #[command(subcommand)]
    what: Option<What>,
}

#[derive(Subcommand, Debug)]
enum What {
    /// Loss, duplication and delay at every rate in every mode, then churn and a vanished
    /// group (the default)
    All(LossArgs),
    /// Only the loss campaign
    Loss(LossArgs),
    /// Only the long message (16 MiB) streamed without loss and at 1 % drops, at every
    /// window and MTU
    Long(LossArgs),
    /// Only group churn: create/allreduce/kill cycles
    Churn {
        #[arg(long, default_value_t = 2000)]
        cycles: usize,
    },
    /// Continuous allreduces for a long time (not in CI)
    Soak {
        /// How long, in minutes
        #[arg(long, default_value_t = 60)]
        minutes: u64,
        /// Allreduces per rank in each job
        #[arg(long, default_value_t = 5000)]
        batch: usize,
    },
    /// A long-running job whose group a switch loses mid-run: a TOR, then the SPINE (2
    /// levels); a TOR, an aggregation switch, then the core (3 levels, library ranks too)
    Vanish {
        /// Which fabrics: 2 (the campaign's), 3 (2 pods × 2 TORs × 2 nodes, 2 cores)
        #[arg(long, value_delimiter = ',', default_values_t = [2, 3])]
        levels: Vec<usize>,
    },
    /// A host outside a running job attacks it, one attack per row (issue 44): forged
    /// contributions and results plain, with IPv4 options, behind a VLAN 0 tag and in
    /// fragments; a wire-id scan; forged host-to-host frames; a control flood; a group
    /// hijack. Each on a two-level and a three-level fabric
    Hostile {
        /// Which fabrics: 2 (2 TORs × 2 nodes under a SPINE), 3 (2 pods × 2 TORs × 2
        /// nodes, 2 aggregation switches per pod, 2 cores)
        #[arg(long, value_delimiter = ',', default_values_t = [2, 3])]
        levels: Vec<usize>,
        /// Seconds each run's job lasts
        #[arg(long, default_value_t = 8)]
        seconds: u64,
        /// Attack library ranks only (no MPI job under the interposer)
        #[arg(long)]
        no_mpi: bool,
        /// Only the attacks whose name contains TEXT (and the control run)
        #[arg(long, value_name = "TEXT")]
        only: Option<String>,
    },
    /// Re-render report.md from a campaign.json (runs nothing)
    Render { file: PathBuf },
}

#[derive(clap::Args, Debug, Default)]
struct LossArgs {
    /// CI's short form: 40 calls per setting at 1 % and 20 %, 3 long messages per setting
    /// (windows and MTUs paired), 100 churn cycles; on the three-level fabric, each fault
    /// at one rate per kind of link (1 % on the host links, 5 % on the level-1 uplinks, 20 %
    /// on the level-2 uplinks), 20 calls per setting
    #[arg(long)]
    short: bool,
    /// Which fabrics the loss settings run on: 2 (every mode; then the long message, churn
    /// and the vanished group), 3 (2 pods × 2 TORs × 2 nodes × 2 sockets, 2 aggregation
    /// switches per pod, 2 cores: `inc-node` and `inc-socket` at 1, 5 and 20 % on the host
    /// links, the level-1 and the level-2 uplinks)
    #[arg(long, value_delimiter = ',', default_values_t = [2, 3])]
    levels: Vec<usize>,
    /// Which collectives' rows run: `allreduce` (the mixed cases, the long message, both
    /// fabrics), `allgather`, `reduce-scatter-block` and `iallreduce` (two levels, inc-node)
    #[arg(long, value_delimiter = ',', value_enum, default_values_t = Collective::ALL)]
    collectives: Vec<Collective>,
    /// Allreduces per rank and setting
    #[arg(long)]
    calls: Option<usize>,
    /// Fault rates (fractions of the INC data packets on each faulty link and direction)
    #[arg(long, value_delimiter = ',')]
    rates: Option<Vec<f64>>,
    #[arg(long, value_delimiter = ',', value_enum)]
    faults: Option<Vec<Fault>>,
    /// Which links are faulty (`uplink1`, `uplink2`: one level's uplinks; `uplink2` only
    /// on the three-level fabric)
    #[arg(long, value_delimiter = ',', value_enum)]
    places: Option<Vec<Place>>,
    #[arg(long, value_delimiter = ',')]
    modes: Option<Vec<Mode>>,
    /// The client's first retry in milliseconds (it doubles per try)
    #[arg(long, default_value_t = 2)]
    retry_ms: u64,
    /// The client's bound per call in seconds
    #[arg(long, default_value_t = 10)]
    timeout_s: u64,
    /// Churn cycles after the loss campaign (`all` only)
    #[arg(long)]
    cycles: Option<usize>,
    /// 16 MiB allreduces per rank and setting of the long-message rows (default 10; 3 in the
    /// short form)
    #[arg(long)]
    long_calls: Option<usize>,
    /// Slots per group of the long-message rows (`innet attach --window`), one fabric each
    #[arg(long, value_delimiter = ',', default_values_t = [DEFAULT_WINDOW, 64])]
    windows: Vec<u32>,
    /// Link MTUs of the long-message rows, one fabric each (9000: jumbo frames of 8 KiB
    /// payloads, which span several XDP buffers; 3506: the most that fits one)
    #[arg(long, value_delimiter = ',', default_values_t = [STANDARD_MTU, JUMBO_MTU])]
    mtus: Vec<usize>,
}

impl LossArgs {
    fn plan(&self) -> LossPlan {
        let (calls, rates) = if self.short {
            (40, vec![0.01, 0.2])
        } else {
            (10_000, vec![0.001, 0.01, 0.05, 0.2])
        };
        LossPlan {
            calls: self.calls.unwrap_or(calls),
            collective: Collective::Allreduce,
            cases: CASES.to_vec(),
            rates: self.rates.clone().unwrap_or(rates),
            faults: self
                .faults
                .clone()
                .unwrap_or_else(|| vec![Fault::Drop, Fault::Duplicate, Fault::Delay]),
            places: self
                .places
                .clone()
                .unwrap_or_else(|| vec![Place::Host, Place::Uplink]),
            modes: self.modes.clone().unwrap_or_else(|| {
                vec![
                    Mode::HostRd,
                    Mode::HostRing,
                    Mode::IncNode,
                    Mode::IncSocket,
                    Mode::IncNic,
                    Mode::IncDpu,
                ]
            }),
            retry: Duration::from_millis(self.retry_ms),
            timeout: Duration::from_secs(self.timeout_s),
        }
    }

    /// The three-level fabric's plans, each run in turn: every fault at 1, 5 and 20 % on
    /// the host links, the level-1 and the level-2 uplinks; in the short form each kind of
    /// link at one rate. `--calls`, `--rates`, `--faults`, `--places` and `--modes` apply
    /// (modes other than `host-rd`, `host-ring`, `inc-node` and `inc-socket` are left out:
    /// this fabric runs no NIC or DPU daemons).
    fn three_plans(&self) -> Vec<LossPlan> {
        let base = self.plan();
        let modes: Vec<Mode> = match &self.modes {
            Some(m) => m
                .iter()
                .copied()
                .filter(|m| {
                    matches!(
                        m,
                        Mode::HostRd | Mode::HostRing | Mode::IncNode | Mode::IncSocket
                    )
                })
                .collect(),
            None => vec![Mode::IncNode, Mode::IncSocket],
        };
        let places = self
            .places
            .clone()
            .unwrap_or_else(|| vec![Place::Host, Place::Uplink1, Place::Uplink2]);
        let plan = |places: Vec<Place>, rates: Vec<f64>| LossPlan {
            calls: self
                .calls
                .unwrap_or(if self.short { 20 } else { base.calls }),
            places,
            rates: self.rates.clone().unwrap_or(rates),
            modes: modes.clone(),
            ..base.clone()
        };
        if self.short {
            let rate = |p: Place| match p {
                Place::Host => 0.01,
                Place::Uplink1 => 0.05,
                Place::Uplink | Place::Uplink2 => 0.2,
            };
            return places
                .into_iter()
                .map(|p| plan(vec![p], vec![rate(p)]))
                .collect();
        }
        vec![plan(places, vec![0.01, 0.05, 0.2])]
    }

    /// The two-level fabric's plan, without `uplink2` (that fabric has one level of
    /// uplinks).
    fn two_plan(&self) -> LossPlan {
        let mut plan = self.plan();
        plan.places.retain(|&p| p != Place::Uplink2);
        plan
    }

    fn runs(&self, levels: usize) -> bool {
        self.levels.contains(&levels)
    }

    /// A long message streamed through the switches without loss and at 1 % drops on the
    /// host links: loss must cost only the lost packets (3 calls per rank in the short form).
    fn long_plan(&self) -> LossPlan {
        LossPlan {
            calls: self.long_calls.unwrap_or(if self.short { 3 } else { 10 }),
            cases: vec![LONG_MESSAGE],
            rates: self.rates.clone().unwrap_or_else(|| vec![0.0, 0.01]),
            faults: vec![Fault::Drop],
            places: vec![Place::Host],
            modes: vec![Mode::IncNode],
            ..self.plan()
        }
    }

    /// Allgather, reduce-scatter and non-blocking allreduce through the switches (inc-node)
    /// with drops and
    /// duplicates on host links and uplinks (20 % in the short form; 1 % and 20 %).
    fn breadth_plans(&self) -> Vec<LossPlan> {
        let base = self.plan();
        [
            Collective::Allgather,
            Collective::ReduceScatterBlock,
            Collective::Iallreduce,
        ]
        .into_iter()
        .filter(|c| self.collectives.contains(c))
        .map(|collective| LossPlan {
            calls: self.calls.unwrap_or(if self.short { 20 } else { 1000 }),
            collective,
            cases: BREADTH_CASES.to_vec(),
            rates: self.rates.clone().unwrap_or_else(|| {
                if self.short {
                    vec![0.2]
                } else {
                    vec![0.01, 0.2]
                }
            }),
            faults: vec![Fault::Drop, Fault::Duplicate],
            modes: vec![Mode::IncNode],
            ..base.clone()
        })
        .collect()
    }

    /// The fabrics of the long-message rows: every window at every MTU, or in the short
    /// form the two lists paired (the default window on standard links, 64 slots on jumbo
    /// links), so that CI builds two fabrics, not four.
    fn long_settings(&self) -> Vec<Setting> {
        let setting = |window: u32, mtu: usize| Setting {
            window: (window != DEFAULT_WINDOW).then_some(window),
            mtu: (mtu != STANDARD_MTU).then_some(mtu),
            ..Setting::default()
        };
        if self.short {
            return self
                .windows
                .iter()
                .zip(&self.mtus)
                .map(|(&w, &m)| setting(w, m))
                .collect();
        }
        self.mtus
            .iter()
            .flat_map(|&m| self.windows.iter().map(move |&w| setting(w, m)))
            .collect()
    }

    fn cycles(&self) -> usize {
        self.cycles.unwrap_or(if self.short { 100 } else { 2000 })
    }
}

fn bar(len: u64, unit: &str) -> ProgressBar {
    ProgressBar::new(len).with_style(
        ProgressStyle::with_template(&format!(
            "{{elapsed_precise}} [{{bar:30}}] {{pos}}/{{len}} {unit} {{msg}} (eta {{eta}})"
        ))
        .expect("progress template")
        .progress_chars("=> "),
    )
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    innet_lab::tear_down_on_signals("innet-campaign");
    if let Err(e) = std::fs::create_dir_all(&cli.out) {
        eprintln!("error: cannot create {}: {e}", cli.out.display());
        return ExitCode::FAILURE;
    }
    let what = cli.what.unwrap_or(What::All(LossArgs::default()));
    let results = if let What::Render { file } = &what {
        match innet_lab::read_json::<Results>(file, "campaign.json") {
            Ok(r) => r,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        run(&what)
    };
    write(&cli.out, &results, matches!(what, What::Render { .. }))
}

fn run(what: &What) -> Results {
    innet_lab::require_root();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "error".into()))
        .with_writer(std::io::stderr)
        .try_init();
    let mut results = Results {
        machine: Machine::this(),
        settings: std::env::args().skip(1).collect::<Vec<_>>().join(" "),
        ..Results::default()
    };
    if let What::All(args) | What::Loss(args) = what
        && args.runs(3)
        && args.collectives.contains(&Collective::Allreduce)
    {
        eprintln!("building the three-level wired fabric, starting daemons …");
        let three = WiredFabric::with(Setting {
            three_levels: true,
            ..Setting::default()
        });
        for plan in args.three_plans() {
            let b = bar(plan.settings().len() as u64, "settings");
            results.loss.extend(loss::run(&three, &plan, &b));
            b.finish_with_message("three-level loss settings done");
        }
        if !args.runs(2) {
            return results;
        }
    }
    if let What::Hostile {
        levels,
        seconds,
        no_mpi,
        only,
    } = what
    {
        results.hostile = hostile_rows(levels, *seconds, !no_mpi, only.clone());
        return results;
    }
    eprintln!("building the wired fabric, starting daemons …");
    let fabric = WiredFabric::new();
    match what {
        What::All(args) | What::Loss(args) => {
            let plan = args.two_plan();
            let allreduce = args.collectives.contains(&Collective::Allreduce);
            let mut rows = vec![];
            if allreduce {
                let b = bar(plan.settings().len() as u64, "settings");
                rows = loss::run(&fabric, &plan, &b);
                b.finish_with_message("loss campaign done");
            }
            // The two-level rows first, as before.
            rows.append(&mut results.loss);
            results.loss = rows;
            for plan in args.breadth_plans() {
                let b = bar(plan.settings().len() as u64, "settings");
                results.loss.extend(loss::run(&fabric, &plan, &b));
                b.finish_with_message(format!("{} under loss done", plan.collective.name()));
            }
            if allreduce {
                results.loss.extend(long_rows(args, &fabric));
            }
            if matches!(what, What::All(_)) {
                let b = bar(args.cycles() as u64, "cycles");
                results.churn = vec![churn::run(&fabric, args.cycles(), &b)];
                b.finish_with_message("churn done");
                eprintln!("a long-running MPI program loses its group …");
                results.vanish = vanish::run(&fabric);
            }
        }
        What::Long(args) => results.loss = long_rows(args, &fabric),
        What::Churn { cycles } => {
            let b = bar(*cycles as u64, "cycles");
            results.churn = vec![churn::run(&fabric, *cycles, &b)];
            b.finish_with_message("churn done");
        }
        What::Soak { minutes, batch } => {
            let b = bar(minutes * 60, "s");
            results.soak = soak::run(&fabric, Duration::from_secs(minutes * 60), *batch, &b);
            b.finish_with_message("soak done");
        }
        What::Vanish { levels } => {
            if levels.contains(&2) {
                results.vanish = vanish::run(&fabric);
            }
            if levels.contains(&3) {
                eprintln!("building the three-level fabric for the vanished group …");
                results
                    .vanish
                    .extend(vanish::run_levels(&vanish::Levels::new()));
            }
        }
        What::Render { .. } | What::Hostile { .. } => {
            unreachable!("rendering runs nothing; the attacks ran above")
        }
    }
    results
}

/// Every attack on each fabric of `levels` switch levels, `seconds` per run.
fn hostile_rows(
    levels: &[usize],
    seconds: u64,
    mpi: bool,
    only: Option<String>,
) -> Vec<HostileRow> {
    let plan = hostile::AttackPlan {
        run: Duration::from_secs(seconds),
        mpi,
        only,
    };
    let mut rows = vec![];
    for &l in levels {
        eprintln!("building the {l}-level wired fabric for the attacks …");
        let fabric = WiredFabric::with(Setting {
            three_levels: l >= 3,
            ..Setting::default()
        });
        rows.extend(hostile::run(&fabric, &plan));
    }
    rows
}

/// The long message at every window and MTU: the default fabric's rows on `fabric`, the
/// others each on a fabric of their own.
fn long_rows(args: &LossArgs, fabric: &WiredFabric) -> Vec<LossRow> {
    let long = args.long_plan();
    let mut rows = vec![];
    for setting in args.long_settings() {
        let own = (setting != Setting::default()).then(|| {
            eprintln!("building a fabric of {setting:?} …");
            WiredFabric::with(setting)
        });
        let b = bar(long.settings().len() as u64, "settings");
        let mut got = loss::run(own.as_ref().unwrap_or(fabric), &long, &b);
        b.finish_with_message(format!("long message under loss, {setting:?}, done"));
        for r in &mut got {
            (r.window, r.mtu) = (setting.window, setting.mtu);
        }
        rows.extend(got);
    }
    rows
}

fn write(out: &std::path::Path, results: &Results, rendering: bool) -> ExitCode {
    let json = out.join("campaign.json");
    if !rendering
        && let Err(e) = std::fs::write(&json, serde_json::to_vec_pretty(results).expect("json"))
    {
        eprintln!("error: writing {}: {e}", json.display());
        return ExitCode::FAILURE;
    }
    let md = tables::markdown(results);
    let md_path = out.join("report.md");
    if let Err(e) = std::fs::write(&md_path, &md) {
        eprintln!("error: writing {}: {e}", md_path.display());
        return ExitCode::FAILURE;
    }
    println!("{md}");
    println!("wrote {}", md_path.display());
    let failures = tables::failures(results);
    if failures.is_empty() {
        return ExitCode::SUCCESS;
    }
    for f in &failures {
        eprintln!("error: {f}");
    }
    ExitCode::FAILURE
}
