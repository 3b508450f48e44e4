//! The loss campaign: every mode's allreduces through a wired fabric whose host links or
//! uplinks drop, duplicate or delay INC data at a given rate, in both directions. Every
//! result is checked on every rank; every call is timed against its bound.

use std::{
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::{Duration, Instant},
};

use indicatif::ProgressBar;
use innet_client::Mode;
use innet_common::fault::{KIND_CONTRIBUTION, KIND_RESULT};
use innet_lab::wire_faults::Faults;

pub use super::fabric::Place;
use super::{
    LossRow,
    fabric::WiredFabric,
    workload::{Case, Collective, RankTally, answers, calls},
};
use innet_lab::job::run_job;

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
pub struct LossPlan {
    pub calls: usize,
    /// The collective each rank calls, cycling through `cases`.
    pub collective: Collective,
    pub cases: Vec<Case>,
    pub rates: Vec<f64>,
    pub faults: Vec<Fault>,
    pub places: Vec<Place>,
    pub modes: Vec<Mode>,
    /// The client's first retry (doubling) and its bound per call.
    pub retry: Duration,
    pub timeout: Duration,
}

impl LossPlan {
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

/// Runs every setting of `plan` on `fabric`; a row per setting.
#[must_use]
pub fn run(fabric: &WiredFabric, plan: &LossPlan, progress: &ProgressBar) -> Vec<LossRow> {
    let answers = answers(fabric.layout.size, plan.collective, &plan.cases);
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
        let counted = links_logged().then(|| fabric.counters(place));
        let tallies = run_setting(fabric, plan, mode, &answers);
        let injected = fabric.injected(place) - before;
        if let Some(counted) = counted {
            log_links(&counted, &fabric.counters(place));
        }
        fabric.set(place, Faults::default());
        rows.push(row(
            (place, fault, rate, mode),
            (fabric.layout.size, fabric.levels()),
            plan,
            &tallies,
            injected,
        ));
        progress.inc(1);
    }
    rows
}

/// `INNET_CAMPAIGN_LINKS=1`: each setting prints, per faulty link and direction, the INC
/// packets its wire saw and what it did to them (for finding where traffic goes).
fn links_logged() -> bool {
    std::env::var_os("INNET_CAMPAIGN_LINKS").is_some_and(|v| v == "1")
}

fn log_links(
    before: &[(
        innet_lab::topology::Link,
        innet_lab::topology::Dir,
        innet_common::fault::FaultStats,
    )],
    after: &[(
        innet_lab::topology::Link,
        innet_lab::topology::Dir,
        innet_common::fault::FaultStats,
    )],
) {
    for ((link, dir, b), (_, _, a)) in before.iter().zip(after) {
        eprintln!(
            "  {link:?} {dir:?}: frames {}, contributions {}, results {}, dropped {}, duplicated {}, delayed {}",
            a.frames - b.frames,
            a.contributions - b.contributions,
            a.results - b.results,
            a.dropped - b.dropped,
            a.duplicated - b.duplicated,
            a.delayed - b.delayed
        );
    }
}

fn row(
    (place, fault, rate, mode): (Place, Fault, f64, Mode),
    (ranks, levels): (usize, usize),
    plan: &LossPlan,
    tallies: &[RankTally],
    injected: u64,
) -> LossRow {
    let calls = plan.calls;
    let sum = |f: fn(&RankTally) -> usize| tallies.iter().map(f).sum::<usize>();
    let total: Duration = tallies.iter().map(|t| t.total).sum();
    LossRow {
        collective: plan.collective.name().into(),
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
        fallback_reasons: {
            let mut reasons = std::collections::BTreeMap::new();
            for (why, n) in tallies.iter().flat_map(|t| &t.fallback_reasons) {
                *reasons.entry(why.clone()).or_insert(0) += n;
            }
            reasons
        },
        retransmissions: tallies.iter().map(|t| t.retransmissions).sum(),
        faults_injected: injected,
        max_call_ms: tallies
            .iter()
            .map(|t| t.max_call.as_secs_f64() * 1e3)
            .fold(0.0, f64::max),
        avg_call_us: total.as_secs_f64() * 1e6 / (calls * ranks).max(1) as f64,
        first_error: tallies.iter().find_map(|t| t.first_error.clone()),
        // A plan of one message size, or the mixed cases (0).
        bytes: match plan.cases.as_slice() {
            [(_, _, bytes)] => *bytes,
            _ => 0,
        },
        window: None,
        mtu: None,
        levels,
    }
}

/// One job of `plan.calls` allreduces per rank, under a watchdog: a call that never
/// returns ends the process loudly, its fabric torn down (a hang is the one thing no row
/// can describe).
fn run_setting(
    fabric: &WiredFabric,
    plan: &LossPlan,
    mode: Mode,
    answers: &[Vec<u8>],
) -> Vec<RankTally> {
    let bound = plan.timeout + Duration::from_secs(1);
    let progress_at = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let epoch = Instant::now();
    // The last call any rank finished: rank in the high half, call in the low.
    let last_call = AtomicU64::new(u64::MAX);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let last = Duration::from_millis(progress_at.load(Ordering::Relaxed));
                if epoch.elapsed().saturating_sub(last) > bound * 3 {
                    let last = last_call.load(Ordering::Relaxed);
                    eprintln!(
                        "error: HANG: no allreduce of {mode} returned for {:?} (last: rank {} finished call {})",
                        bound * 3,
                        last >> 32,
                        last & 0xffff_ffff
                    );
                    innet_lab::exit_torn_down(3);
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
                calls(
                    comm,
                    plan.calls,
                    (plan.collective, &plan.cases),
                    answers,
                    bound,
                    |rank, i| {
                        progress_at.store(epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
                        last_call.store((rank as u64) << 32 | i as u64, Ordering::Relaxed);
                    },
                )
            },
        );
        done.store(true, Ordering::Relaxed);
        tallies
    })
}
