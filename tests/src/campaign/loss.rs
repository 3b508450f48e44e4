//! The loss campaign: every mode's allreduces through a wired fabric whose host links or
//! uplinks drop, duplicate or delay INC data at a given rate, in both directions. Every
//! result is checked on every rank; every call is timed against its bound.

use std::{
    sync::{
        Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use indicatif::ProgressBar;
use innet::{
    client::{Communicator, Layout, Mode},
    fault::Faults,
    loader::Mode as XdpMode,
};
use innet_common::{
    fault::{FaultStats, KIND_CONTRIBUTION, KIND_RESULT},
    proto::{Dtype, Op, element_bytes},
};

use innet::group::GroupMaps;

use super::LossRow;
use crate::{
    daemons::{DaemonGuard, daemons_on, learn_hosts, nic_daemons_on, rss_kib},
    job::{expected, input, run_job},
    topology::{Dir, Link, Options, Shape, Topology},
};

/// Which links are faulty.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Place {
    /// Every host's link to its TOR.
    Host,
    /// Every TOR's link to the SPINE.
    Uplink,
}

impl Place {
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Host => "host links",
            Self::Uplink => "uplinks",
        }
    }
}

/// What the faulty links do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Fault {
    Drop,
    Duplicate,
    /// Held back `DELAY` (later packets overtake it).
    Delay,
}

/// How long a delayed packet is held: longer than a lossless allreduce, shorter than the
/// first retry, so the delayed copy usually races its own retransmission.
pub const DELAY: Duration = Duration::from_millis(1);

impl Fault {
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Drop => "drop",
            Self::Duplicate => "duplicate",
            Self::Delay => "delay",
        }
    }

    fn at(self, rate: f64) -> Faults {
        let mut f = Faults {
            kinds: KIND_CONTRIBUTION | KIND_RESULT,
            delay_for: DELAY,
            ..Faults::default()
        };
        match self {
            Self::Drop => f.drop = rate,
            Self::Duplicate => f.duplicate = rate,
            Self::Delay => f.delay = rate,
        }
        f
    }
}

/// The campaign's settings.
#[derive(Clone, Debug)]
pub struct Plan {
    pub calls: usize,
    pub rates: Vec<f64>,
    pub faults: Vec<Fault>,
    pub places: Vec<Place>,
    pub modes: Vec<Mode>,
    /// The client's first retry (doubling) and its bound per call.
    pub retry: Duration,
    pub timeout: Duration,
}

impl Plan {
    /// Settings in run order: (place, fault, rate, mode).
    #[must_use]
    pub fn settings(&self) -> Vec<(Place, Fault, f64, Mode)> {
        let mut out = vec![];
        for &place in &self.places {
            for &fault in &self.faults {
                for &rate in &self.rates {
                    for &mode in &self.modes {
                        out.push((place, fault, rate, mode));
                    }
                }
            }
        }
        out
    }
}

/// The collectives each rank cycles through: (op, type, bytes) — one element, a partial
/// packet, a full packet, several packets.
const CASES: [(Op, Dtype, usize); 5] = [
    (Op::Sum, Dtype::I32, 4),
    (Op::Max, Dtype::U16, 64),
    (Op::Minloc, Dtype::I32, 256),
    (Op::Bxor, Dtype::U64, 1408),
    (Op::Sum, Dtype::I64, 4000),
];

/// The fabric: 2 TORs × 2 nodes × 2 sockets under one SPINE, every link through a wire,
/// switch daemons on every switch and a NIC daemon on every node; 8 ranks (one per socket).
pub struct Fabric {
    // Daemons stop before the fabric goes.
    daemons: Vec<DaemonGuard>,
    pub topo: Topology,
    pub layout: Layout,
}

impl Fabric {
    #[must_use]
    pub fn new() -> Self {
        let topo = Topology::with(
            Shape {
                tors: 2,
                hosts_per_tor: 2,
                sockets: 2,
                spines: 1,
                mode: XdpMode::Native,
            },
            Options {
                innet: true,
                wires: true,
            },
        );
        learn_hosts(&topo);
        let mut daemons = daemons_on(&topo, &[]);
        daemons.extend(nic_daemons_on(&topo, &[]));
        Self {
            daemons,
            layout: Layout::new(8, 2, 2).expect("layout"),
            topo,
        }
    }

    /// Groups installed on every switch and NIC, and the daemons' resident memory (KiB).
    #[must_use]
    pub fn state(&self) -> (usize, u64) {
        let pins = self
            .topo
            .tors
            .iter()
            .chain(&self.topo.spines)
            .map(|s| &s.pins)
            .chain(
                self.topo
                    .hosts
                    .iter()
                    .filter(|h| h.socket == 0)
                    .map(|h| &h.pins),
            );
        let groups = pins
            .filter_map(|p| GroupMaps::open(&p.layout).ok())
            .map(|m| m.list().map_or(0, |l| l.len()))
            .sum();
        let rss = self
            .daemons
            .iter()
            .map(|d| rss_kib(d.0.id()).unwrap_or(0))
            .sum();
        (groups, rss)
    }

    fn links(&self, place: Place) -> Vec<Link> {
        let mut links: Vec<Link> = self
            .topo
            .wires
            .as_ref()
            .expect("wired")
            .links()
            .filter(|l| {
                matches!(
                    (place, l),
                    (Place::Host, Link::Host(_)) | (Place::Uplink, Link::Uplink { .. })
                )
            })
            .collect();
        links.sort_by_key(|l| format!("{l:?}"));
        links
    }

    /// Sets `faults` on both directions of every link of `place`.
    fn set(&self, place: Place, faults: Faults) {
        let wires = self.topo.wires.as_ref().expect("wired");
        for link in self.links(place) {
            for dir in [Dir::Up, Dir::Down] {
                wires.set(link, dir, faults);
            }
        }
    }

    /// Packets dropped + duplicated + delayed so far on the links of `place`.
    fn injected(&self, place: Place) -> u64 {
        let wires = self.topo.wires.as_ref().expect("wired");
        let mut sum = FaultStats::default();
        for link in self.links(place) {
            for dir in [Dir::Up, Dir::Down] {
                sum.accumulate(&wires.stats(link, dir));
            }
        }
        sum.dropped + sum.duplicated + sum.delayed
    }
}

impl Default for Fabric {
    fn default() -> Self {
        Self::new()
    }
}

/// What one rank observed.
#[derive(Default)]
pub struct RankTally {
    pub wrong: usize,
    pub errors: usize,
    pub hangs: usize,
    pub fallbacks: usize,
    pub retransmissions: u64,
    pub max_call: Duration,
    pub total: Duration,
    pub first_error: Option<String>,
}

/// Runs every setting of `plan` on `fabric`; a row per setting.
#[must_use]
pub fn run(fabric: &Fabric, plan: &Plan, progress: &ProgressBar) -> Vec<LossRow> {
    let answers = answers(fabric.layout.size);
    let mut rows = vec![];
    for (place, fault, rate, mode) in plan.settings() {
        progress.set_message(format!(
            "{mode}, {} {:.1} % on {}",
            fault.name(),
            rate * 100.0,
            place.name()
        ));
        fabric.set(place, fault.at(rate));
        let before = fabric.injected(place);
        let tallies = run_setting(fabric, plan, mode, &answers);
        let injected = fabric.injected(place) - before;
        fabric.set(place, Faults::default());
        rows.push(row(
            (place, fault, rate, mode),
            fabric.layout.size,
            plan.calls,
            &tallies,
            injected,
        ));
        progress.inc(1);
    }
    rows
}

fn row(
    (place, fault, rate, mode): (Place, Fault, f64, Mode),
    ranks: usize,
    calls: usize,
    tallies: &[RankTally],
    injected: u64,
) -> LossRow {
    let sum = |f: fn(&RankTally) -> usize| tallies.iter().map(f).sum::<usize>();
    let total: Duration = tallies.iter().map(|t| t.total).sum();
    LossRow {
        mode: mode.name().into(),
        place: place.name().into(),
        fault: fault.name().into(),
        rate,
        ranks,
        calls,
        wrong: sum(|t| t.wrong),
        errors: sum(|t| t.errors),
        hangs: sum(|t| t.hangs),
        fallbacks: sum(|t| t.fallbacks),
        retransmissions: tallies.iter().map(|t| t.retransmissions).sum(),
        faults_injected: injected,
        max_call_ms: tallies
            .iter()
            .map(|t| t.max_call.as_secs_f64() * 1e3)
            .fold(0.0, f64::max),
        avg_call_us: total.as_secs_f64() * 1e6 / (calls * ranks).max(1) as f64,
        first_error: tallies.iter().find_map(|t| t.first_error.clone()),
    }
}

/// One job of `plan.calls` allreduces per rank, under a watchdog: a call that never
/// returns ends the process loudly (a hang is the one thing no row can describe).
fn run_setting(fabric: &Fabric, plan: &Plan, mode: Mode, answers: &[Vec<u8>]) -> Vec<RankTally> {
    let bound = plan.timeout + Duration::from_secs(1);
    let progress_at = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let epoch = Instant::now();
    let stalled_at = Mutex::new(String::new());
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let last = Duration::from_millis(progress_at.load(Ordering::Relaxed));
                if epoch.elapsed().saturating_sub(last) > bound * 3 {
                    eprintln!(
                        "error: HANG: no allreduce of {mode} returned for {:?} ({})",
                        bound * 3,
                        stalled_at.lock().map(|s| s.clone()).unwrap_or_default()
                    );
                    std::process::exit(3);
                }
            }
        });
        let tallies = run_job(
            &fabric.topo,
            fabric.layout,
            mode,
            |c| {
                c.retry = plan.retry;
                c.timeout = plan.timeout;
            },
            |comm| {
                calls(comm, plan.calls, answers, bound, |rank, i| {
                    progress_at.store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
                    if let Ok(mut s) = stalled_at.lock() {
                        *s = format!("last: rank {rank} finished call {i}");
                    }
                })
            },
        );
        done.store(true, Ordering::Relaxed);
        tallies
    })
}

/// The expected result of each of [`CASES`] for `size` ranks.
#[must_use]
pub fn answers(size: usize) -> Vec<Vec<u8>> {
    CASES
        .iter()
        .enumerate()
        .map(|(c, &(op, dtype, bytes))| {
            expected(size, c, op, dtype, bytes / element_bytes(op, dtype))
        })
        .collect()
}

/// `n` allreduces cycling through [`CASES`], each checked and timed.
pub fn calls(
    comm: &mut Communicator,
    n: usize,
    answers: &[Vec<u8>],
    bound: Duration,
    mut progressed: impl FnMut(usize, usize),
) -> RankTally {
    let rank = comm.rank();
    let inputs: Vec<Vec<u8>> = CASES
        .iter()
        .enumerate()
        .map(|(c, &(op, dtype, bytes))| input(rank, c, op, dtype, bytes / element_bytes(op, dtype)))
        .collect();
    let mut t = RankTally::default();
    for i in 0..n {
        let c = i % CASES.len();
        let (op, dtype, _) = CASES[c];
        let mut recv = vec![0u8; inputs[c].len()];
        let start = Instant::now();
        let result = comm.allreduce(&inputs[c], &mut recv, op, dtype);
        let took = start.elapsed();
        match result {
            Ok(report) => {
                t.wrong += usize::from(recv != answers[c]);
                t.fallbacks += usize::from(report.fallback.is_some());
                t.retransmissions += u64::from(report.retransmissions);
            }
            Err(e) => {
                t.errors += 1;
                t.first_error
                    .get_or_insert_with(|| format!("rank {rank} call {i}: {e}"));
            }
        }
        t.hangs += usize::from(took > bound);
        t.max_call = t.max_call.max(took);
        t.total += took;
        progressed(rank, i);
    }
    t
}
