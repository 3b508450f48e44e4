//! A long-running job loses its group on the switches, at every level.
//!
//! `steady_allreduce` (one rank per node, the interposer preloaded, MPI's own traffic over
//! the fabric) runs allreduces back to back while the campaign deletes the job's group on a
//! TOR (the next contribution comes back unaggregated to a host: hosts send their
//! contributions to each other's addresses), on an aggregation switch or on the top switch
//! (a SPINE or a core: the partial sent to that switch's own address comes back as a
//! group-lost notice; before the notice existed, the results stopped and the hosts waited
//! for a timeout). The program counts its calls per 100 ms window; the time the event cost
//! is the calls missing against the run's own steady rate.
//!
//! On the three-level fabric the same events also hit a job of library ranks
//! ([`run_levels`]), which times every collective: the time lost is the excess over the
//! median collective of the ones from the first that ended after the deletion to the one
//! that set the group up again, and the collectives off the network are counted (one means
//! that the next collective after the one that found out was on the network again).

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

use innet::group_maps::GroupMaps;
use innet_client::{Communicator, Layout, Mode, Path};
use innet_common::proto::{Dtype, Op};

use super::{
    VanishRow,
    fabric::WiredFabric,
    steady::{Windows, steady_allreduce, whole_windows},
};
use innet_lab::{
    daemons::{DaemonGuard, daemons_on, learn_hosts, nic_daemons_on},
    job::run_job,
    mpi::{Flavour, MpiRun, reports},
    topology::{Options, Shape, Switch, Topology},
};

/// Where the group is deleted (`Nowhere`: the control run, whose time lost is the
/// measure's noise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Where {
    Nowhere,
    /// The first TOR (a host finds the group lost from an unaggregated contribution).
    Tor,
    /// The first pod's aggregation switch in the tree (3 levels; a group-lost notice).
    Agg,
    /// The tree's root: the SPINE (2 levels) or its core (3 levels; a group-lost notice).
    Spine,
}

impl Where {
    /// The places on a fabric of `levels` switch levels.
    #[must_use]
    pub fn on(levels: usize) -> Vec<Self> {
        if levels >= 3 {
            vec![Self::Nowhere, Self::Tor, Self::Agg, Self::Spine]
        } else {
            vec![Self::Nowhere, Self::Tor, Self::Spine]
        }
    }

    fn name(self, levels: usize) -> String {
        let what = match (self, levels) {
            (Self::Nowhere, _) => "nothing (control run)",
            (Self::Tor, _) => "innet group del on a TOR",
            (Self::Agg, _) => "innet group del on an aggregation switch",
            (Self::Spine, 3) => "innet group del on the core",
            (Self::Spine, _) => "innet group del on the SPINE",
        };
        if levels >= 3 {
            format!("3 levels: {what}")
        } else {
            what.into()
        }
    }

    /// The switches that may hold the job's group at this place (the tree picks one
    /// aggregation switch per pod and one core).
    fn switches(self, topo: &Topology) -> Vec<&Switch> {
        match self {
            Self::Nowhere | Self::Tor => vec![&topo.tors[0]],
            Self::Agg => topo.aggs.iter().filter(|a| a.pod == Some(0)).collect(),
            Self::Spine => topo.spines.iter().collect(),
        }
    }
}

/// How long each run lasts.
const RUN: Duration = Duration::from_secs(6);
/// How long after the job's group appears it is deleted: past the 2 s after a set-up in
/// which a switch's daemon sends no group-lost notice (a group in set-up is not lost).
const AFTER: Duration = Duration::from_secs(3);

pub(super) fn groups_on(sw: &Switch) -> Vec<u32> {
    GroupMaps::open(&sw.pins.layout)
        .and_then(|m| m.list())
        .map(|l| l.iter().map(|g| g.id).collect())
        .unwrap_or_default()
}

/// Waits (up to `limit`) until one of `sws` holds a group not in `old`; returns it and
/// that switch.
pub(super) fn new_group<'a>(
    sws: &[&'a Switch],
    old: &[u32],
    limit: Duration,
) -> Option<(&'a Switch, u32)> {
    let start = Instant::now();
    while start.elapsed() < limit {
        for sw in sws {
            if let Some(g) = groups_on(sw).into_iter().find(|g| !old.contains(g)) {
                return Some((sw, g));
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// One MPI run per place on the campaign's (two-level) fabric.
#[must_use]
pub fn run(fabric: &WiredFabric) -> Vec<VanishRow> {
    let topo = &fabric.topo;
    Where::on(topo.shape.levels)
        .into_iter()
        .map(|w| run_one(topo, w))
        .collect()
}

/// The three-level fabric of [`run_levels`]: 2 pods × 2 TORs × 2 single-port nodes, 2
/// aggregation switches per pod, 2 cores, every link through a wire, a daemon on every
/// switch and every node.
pub struct Levels {
    // Daemons stop before the fabric goes.
    _daemons: Vec<DaemonGuard>,
    pub topo: Topology,
}

impl Levels {
    #[must_use]
    pub fn new() -> Self {
        let topo = Topology::with(
            Shape::three_level(2, 2, 2, 2, 2),
            Options {
                innet: true,
                wires: true,
                ..Options::default()
            },
        );
        learn_hosts(&topo);
        let mut daemons = daemons_on(&topo, &[]);
        daemons.extend(nic_daemons_on(&topo, &[]));
        Self {
            _daemons: daemons,
            topo,
        }
    }
}

impl Default for Levels {
    fn default() -> Self {
        Self::new()
    }
}

/// Every place of a three-level fabric (a TOR, an aggregation switch, the core, and the
/// control run), each with an MPI run and a run of library ranks.
#[must_use]
pub fn run_levels(levels: &Levels) -> Vec<VanishRow> {
    let topo = &levels.topo;
    let places = Where::on(topo.shape.levels);
    let mut rows: Vec<VanishRow> = places.iter().map(|&w| run_one(topo, w)).collect();
    rows.extend(places.iter().map(|&w| run_library(topo, w)));
    rows
}

fn run_one(topo: &Topology, place: Where) -> VanishRow {
    let flavour = Flavour::OpenMpi;
    let dir = std::env::temp_dir().join(format!("innet-vanish-{}", innet_lab::unique_id()));
    let reports_dir = dir.join("reports");
    std::fs::create_dir_all(&reports_dir).expect("the scratch directory");
    let nodes = topo.hosts.iter().filter(|h| h.socket == 0).count();
    let program = steady_allreduce(flavour, RUN);
    let mpirun = MpiRun::new(flavour, nodes, &program)
        .over_fabric(topo, 1)
        .env(innet_mpi::session::LEARN_VAR, "0")
        .innet(topo, 1, &dir, &reports_dir);
    let child = mpirun.spawn_captured();
    let sws = place.switches(topo);
    let mut row = VanishRow {
        event: place.name(topo.shape.levels),
        control: place == Where::Nowhere,
        ..VanishRow::default()
    };
    if let Some((sw, id)) = new_group(&sws, &[], Duration::from_secs(30))
        && !row.control
    {
        std::thread::sleep(AFTER);
        let deleted = GroupMaps::open(&sw.pins.layout).and_then(|mut m| m.remove(id));
        row.set_up_again = deleted.is_ok() && new_group(&sws, &[id], RUN).is_some();
    }
    let out = child.wait_with_output().expect("mpirun");
    let stdout = String::from_utf8_lossy(&out.stdout);
    row.ran = out.status.success();
    if !row.ran {
        row.first_error = Some(first_lines(&out.stderr));
    }
    if let Some(w) = Windows::parse(&stdout) {
        (row.calls, row.wrong) = (w.calls, w.wrong);
        (row.steady_calls_per_s, row.lost_ms, row.slowest_window) = lost_time(&w.counts);
    }
    if row.ran {
        let summaries = reports(&reports_dir, nodes);
        row.served = summaries.iter().flat_map(|s| s.served.values()).sum();
        row.fallbacks = summaries.iter().map(|s| s.fallbacks).sum();
    }
    let _ = std::fs::remove_dir_all(&dir);
    row
}

/// A failed run's first 5 lines of error output, on one line.
pub(super) fn first_lines(stderr: &[u8]) -> String {
    String::from_utf8_lossy(stderr)
        .lines()
        .take(5)
        .collect::<Vec<_>>()
        .join(" / ")
}

/// Groups deleted in a library run: the first [`AFTER`] after the job's group appears,
/// each next one [`AFTER`] after the group set up again appears; the run lasts
/// [`LIB_RUN`].
const LIB_EVENTS: usize = 3;
const LIB_RUN: Duration = Duration::from_millis(10_500);

/// One collective of a library run, as rank 0 saw it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Call {
    pub start: Instant,
    pub took: Duration,
    /// On the network, without a fallback.
    pub network: bool,
    pub regrouped: Option<u8>,
}

/// A job of library ranks (one per node, `inc-node`, the library's default retries and
/// timeouts) running checked allreduces of 17 int32 back to back; `place`'s group deleted
/// [`LIB_EVENTS`] times. Rank 0 ends the run: the first element carries its stop flag, so
/// every rank runs the same collectives. The row's time lost is the mean per event.
fn run_library(topo: &Topology, place: Where) -> VanishRow {
    let nodes = topo.hosts.iter().filter(|h| h.socket == 0).count();
    let sws = place.switches(topo);
    let mut row = VanishRow {
        event: format!(
            "{}, library ranks (mean of {LIB_EVENTS})",
            place.name(topo.shape.levels)
        ),
        control: place == Where::Nowhere,
        ..VanishRow::default()
    };
    let old: Vec<u32> = sws.iter().flat_map(|sw| groups_on(sw)).collect();
    let events: Mutex<Vec<Instant>> = Mutex::new(vec![]);
    let out = std::thread::scope(|s| {
        let job = s.spawn(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run_job(
                    topo,
                    Layout::new(nodes, 1, 1).expect("layout"),
                    Mode::IncNode,
                    |_| {},
                    |comm: &mut Communicator| library_body(comm, LIB_RUN, false),
                )
            }))
        });
        let mut seen = old.clone();
        let mut group = new_group(&sws, &seen, Duration::from_secs(30));
        row.set_up_again = group.is_some();
        for _ in 0..LIB_EVENTS {
            let Some((sw, id)) = group else { break };
            std::thread::sleep(AFTER);
            events.lock().expect("lock").push(Instant::now());
            if row.control {
                continue;
            }
            let deleted = GroupMaps::open(&sw.pins.layout).and_then(|mut m| m.remove(id));
            seen.push(id);
            group = new_group(&sws, &seen, AFTER);
            row.set_up_again &= deleted.is_ok() && group.is_some();
        }
        job.join().expect("the job's thread")
    });
    let Ok(out) = out else {
        row.first_error = Some("a rank panicked".into());
        return row;
    };
    row.ran = true;
    row.wrong = out.iter().map(|(w, _)| *w).sum();
    let calls = &out[0].1;
    row.calls = calls.len() as u64;
    row.served = calls.iter().filter(|c| c.network).count() as u64;
    row.fallbacks = row.calls - row.served;
    let events = events.into_inner().expect("lock");
    let mut median = 0.0;
    for (k, &at) in events.iter().enumerate() {
        let (m, lost, detail) = event_cost(calls, Some(at));
        median = m;
        row.lost_ms += lost / events.len() as f64;
        eprintln!("vanish: {}, event {}: {detail}", row.event, k + 1);
    }
    if median > 0.0 {
        row.steady_calls_per_s = 1000.0 / median;
        let slowest = calls
            .iter()
            .map(|c| c.took.as_secs_f64() * 1e3)
            .fold(0.0, f64::max);
        row.slowest_window = median / slowest;
    }
    row
}

/// Fewest calls a body makes before it stops (unless it runs 10 × `run`): on a loaded
/// machine two seconds can hold a few dozen calls, too few for a row's medians and shares.
const MIN_CALLS: i32 = 200;

/// Checked allreduces of 17 int32 back to back for `run` and at least [`MIN_CALLS`] (rank 0
/// decides: the first element carries its stop flag, so every rank runs the same
/// collectives). The rank's wrong results and its calls (`every_rank` false: rank 0's
/// only).
pub(super) fn library_body(
    comm: &mut Communicator,
    run: Duration,
    every_rank: bool,
) -> (u64, Vec<Call>) {
    let n = comm.size() as i32;
    let rank = comm.rank() as i32;
    let begin = Instant::now();
    let (mut wrong, mut calls) = (0, vec![]);
    for call in 0_i32.. {
        let elapsed = begin.elapsed();
        let stop =
            i32::from(rank == 0 && (elapsed > run && call >= MIN_CALLS || elapsed > run * 10));
        let mut send: Vec<i32> = (0..17).map(|k| rank + k + call % 1000).collect();
        send[0] = stop;
        let bytes: Vec<u8> = send.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let mut recv = vec![0u8; bytes.len()];
        let start = Instant::now();
        let r = comm
            .allreduce_bytes(&bytes, &mut recv, Op::Sum, Dtype::I32)
            .unwrap_or_else(|e| panic!("rank {rank}: call {call}: {e}"));
        let took = start.elapsed();
        let got: Vec<i32> = recv
            .chunks_exact(4)
            .map(|c| i32::from_ne_bytes(c.try_into().expect("4 bytes")))
            .collect();
        if (1..17_i32)
            .zip(&got[1..])
            .any(|(k, &v)| v != n * (n - 1) / 2 + n * (k + call % 1000))
        {
            wrong += 1;
        }
        if rank == 0 || every_rank {
            calls.push(Call {
                start,
                took,
                network: matches!(r.path, Path::Network(_)) && r.fallback.is_none(),
                regrouped: r.regrouped,
            });
        }
        if got[0] > 0 {
            break;
        }
    }
    (wrong, calls)
}

/// The median collective (ms), the event's cost (ms: the excess over the median of the
/// collectives from the first that ended after `at` to the first that set the group up
/// again, or of that first one alone when none did), and a line of detail.
fn event_cost(calls: &[Call], at: Option<Instant>) -> (f64, f64, String) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut sorted: Vec<f64> = calls.iter().map(|c| ms(c.took)).collect();
    sorted.sort_by(f64::total_cmp);
    let Some(&median) = sorted.get(sorted.len() / 2) else {
        return (0.0, 0.0, "no calls".into());
    };
    let Some(at) = at else {
        return (median, 0.0, "the group never appeared".into());
    };
    let Some(first) = calls.iter().position(|c| c.start + c.took > at) else {
        return (median, 0.0, "no call after the event".into());
    };
    let upto = calls[first..]
        .iter()
        .position(|c| c.regrouped.is_some())
        .map_or(first, |k| first + k);
    let span = &calls[first..=upto];
    let lost: f64 = span.iter().map(|c| ms(c.took) - median).sum();
    let shown: Vec<String> = calls[first..(upto + 3).min(calls.len())]
        .iter()
        .map(|c| {
            format!(
                "{:.2} ms {}{}",
                ms(c.took),
                if c.network { "net" } else { "HOSTS" },
                c.regrouped
                    .map_or(String::new(), |f| format!(" regrouped({f})"))
            )
        })
        .collect();
    let off = span.iter().filter(|c| !c.network).count();
    let back = calls
        .get(upto..)
        .and_then(|rest| rest.iter().find(|c| c.network))
        .map_or(f64::NAN, |c| ms(c.start + c.took - at));
    let detail = format!(
        "median {median:.3} ms; from the first call after the event to the regroup: {} calls, \
         {lost:.1} ms lost, {off} off the network, back on the network {back:.1} ms after \
         the deletion; calls: [{}]",
        span.len(),
        shown.join(", ")
    );
    (median, lost, detail)
}

/// From calls per 100 ms window: the steady rate (calls/s, the median full window), the
/// time lost against it (ms), and the fullest window's share of it that the slowest
/// window reached. The first and the last window are partial and left out.
#[must_use]
pub fn lost_time(windows: &[u64]) -> (f64, f64, f64) {
    let full = whole_windows(windows);
    if full.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    let mut sorted = full.to_vec();
    sorted.sort_unstable();
    let median = sorted[sorted.len() / 2] as f64;
    if median == 0.0 {
        return (0.0, 0.0, 0.0);
    }
    let lost: f64 = full
        .iter()
        .map(|&c| (median - c as f64).max(0.0) / median * 100.0)
        .sum();
    let slowest = sorted[0] as f64 / median;
    (median * 10.0, lost, slowest)
}

#[cfg(test)]
mod tests {
    use super::lost_time;

    #[test]
    fn lost_time_counts_missing_calls_against_the_median_window() {
        // Partial first and last windows; one window at half speed, one empty.
        let w = [3, 100, 100, 50, 0, 100, 100, 7, 0];
        let (rate, lost, slowest) = lost_time(&w);
        assert!((rate - 1000.0).abs() < 1e-9);
        assert!((lost - 150.0).abs() < 1e-9, "{lost}");
        assert!(slowest.abs() < 1e-9);
    }
}
