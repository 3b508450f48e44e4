//! Where the time of one small allreduce goes: every leader stamps its collectives
//! ([`innet_client::stages`]); the stamps of one call are lined up across the leaders (one
//! clock: every rank is a thread of this process), and the kernel's own run-time statistics
//! of innet's XDP programs (`BPF_ENABLE_STATS`) give their share.
//!
//! For leader `i` of a call, with `F` the moment the last leader handed its packet to the
//! kernel and `R` the first result:
//!
//! ```text
//! returned_i − entry_i = (framed_i − entry_i)     library before the wire
//!                      + (F − framed_i)           waiting for the slowest leader
//!                      + (R − F)                  the network's critical path
//!                      + (result_i − R)           this leader's wake-up after the first
//!                      + (returned_i − result_i)  handing the result back
//! ```
//!
//! The columns are the means of those terms, so they add up to the mean latency. The send
//! system call is no term of its own: the kernel carries the packet through the veths and
//! the XDP programs inside it, so the last sender's call is part of the network's path.

use aya::{
    programs::loaded_programs,
    sys::{Stats, enable_stats},
};
use innet_client::{
    Layout, Mode,
    stages::{CallStamps, Stage},
};
use innet_common::proto::{Dtype, Op};
use serde::{Deserialize, Serialize};

use super::latency::shape_for;
use innet_lab::{
    daemons::{daemons_on, dpu_daemons_on, learn_hosts, nic_daemons_on},
    job::{expected, input, run_job},
    topology::{Options, Topology},
};

/// Message size of the breakdown: the smallest a user sends.
pub const BYTES: usize = 4;
/// Untraced calls first, so the stamps see a steady state.
const WARMUP: usize = 200;

/// The mean split of one allreduce at one shape, in µs per call.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BreakdownRow {
    pub mode: String,
    pub nodes: usize,
    pub ppn: usize,
    pub bytes: usize,
    /// Calls lined up across every leader.
    pub calls: usize,
    /// Mean over leaders and calls of entry → return.
    pub total_us: f64,
    /// Entry → first packet built: argument checks, node-local gather, framing.
    pub library_us: f64,
    /// Of which building the packet (gathered → framed).
    pub framing_us: f64,
    /// The send system call (or the NIC post's `BPF_PROG_TEST_RUN`), packet delivery
    /// inside it included (not a term of the sum).
    pub send_us: f64,
    /// This leader's packet built → the last leader's.
    pub wait_peers_us: f64,
    /// The last packet built → the first leader's result: system call, kernel stacks,
    /// veths, bridges, XDP.
    pub network_us: f64,
    /// The first result → this leader's: wake-ups and scheduling of the other leaders.
    pub wake_us: f64,
    /// Result → return: copy out, local broadcast, bookkeeping.
    pub return_us: f64,
    /// Times per call a leader blocked in the kernel (the rest of its waits spun).
    pub blocked_per_call: f64,
    /// innet's XDP programs over the traced calls: runs per call, ns per run.
    pub xdp_runs_per_call: f64,
    pub xdp_ns_per_run: f64,
    /// Collectives that ran on the hosts (their stamps are left out).
    pub fallbacks: usize,
    /// Results that differed from the reference (over all ranks, warm-up included).
    pub errors: usize,
}

/// Runs `calls` traced 4 B int32 SUM allreduces at `nodes` × 1 rank per node in each of
/// `modes` (the in-network ones: the host path sends no INC packet).
#[must_use]
pub fn run(node_counts: &[usize], modes: &[Mode], calls: usize) -> Vec<BreakdownRow> {
    let mut rows = vec![];
    for &nodes in node_counts {
        let dpus = modes.contains(&Mode::IncDpu);
        let topo = Topology::with(
            shape_for(nodes),
            Options {
                innet: true,
                dpus,
                ..Options::default()
            },
        );
        learn_hosts(&topo);
        let _daemons = daemons_on(&topo, &[]);
        let _nic_daemons = modes
            .contains(&Mode::IncNic)
            .then(|| nic_daemons_on(&topo, &[]));
        let _dpu_daemons = dpus.then(|| dpu_daemons_on(&topo, &[]));
        for &mode in modes {
            rows.push(run_one(&topo, nodes, mode, calls));
        }
    }
    rows
}

/// One rank's output: its stamps, and on rank 0 the XDP statistics' change over them.
struct RankTrace {
    stamps: Vec<CallStamps>,
    fallbacks: usize,
    errors: usize,
    xdp: Option<XdpStats>,
}

fn run_one(topo: &Topology, nodes: usize, mode: Mode, calls: usize) -> BreakdownRow {
    let layout = Layout::new(nodes, 1, 1).expect("one rank per node");
    let answer = expected(nodes, 0, Op::Sum, Dtype::I32, BYTES / 4);
    // Held for the run: the kernel counts run time only while someone asks for it.
    let _stats = enable_stats(Stats::RunTime).expect("BPF_ENABLE_STATS (kernel 5.8+, root)");
    let per_rank = run_job(
        topo,
        layout,
        mode,
        |_| {},
        |comm| {
            let send = input(comm.rank(), 0, Op::Sum, Dtype::I32, BYTES / 4);
            let mut recv = vec![0u8; BYTES];
            let (mut fallbacks, mut errors) = (0, 0);
            let mut before = None;
            for i in 0..WARMUP + calls {
                if i == WARMUP {
                    before = (comm.rank() == 0).then(XdpStats::now);
                    comm.trace_calls(calls);
                }
                let report = comm
                    .allreduce_bytes(&send, &mut recv, Op::Sum, Dtype::I32)
                    .unwrap_or_else(|e| panic!("rank {}: {e}", comm.rank()));
                fallbacks += usize::from(i >= WARMUP && report.fallback.is_some());
                errors += usize::from(recv != answer);
            }
            RankTrace {
                stamps: comm.stages().clone(),
                fallbacks,
                errors,
                xdp: before.map(|b| XdpStats::now().since(&b)),
            }
        },
    );
    let xdp = per_rank[0].xdp.unwrap_or_default();
    let mut row = split(&per_rank.iter().map(|r| &r.stamps[..]).collect::<Vec<_>>());
    row.mode = mode.name().into();
    row.nodes = nodes;
    row.fallbacks = per_rank.iter().map(|r| r.fallbacks).sum();
    row.errors = per_rank.iter().map(|r| r.errors).sum();
    row.xdp_runs_per_call = xdp.runs as f64 / calls.max(1) as f64;
    row.xdp_ns_per_run = xdp.nanos as f64 / xdp.runs.max(1) as f64;
    row
}

/// The mean split over the calls every leader stamped through the network.
#[must_use]
pub fn split(leaders: &[&[CallStamps]]) -> BreakdownRow {
    let mut row = BreakdownRow {
        nodes: leaders.len(),
        ppn: 1,
        bytes: BYTES,
        ..BreakdownRow::default()
    };
    let calls = leaders.iter().map(|l| l.len()).min().unwrap_or(0);
    let mut samples = 0.0;
    for c in 0..calls {
        let Some(stamps) = leaders
            .iter()
            .map(|l| Stamped::of(&l[c]))
            .collect::<Option<Vec<_>>>()
        else {
            continue; // a call that ran on the hosts
        };
        let last_framed = stamps.iter().map(|s| s.framed).max().unwrap_or(0);
        let first_result = stamps.iter().map(|s| s.result).min().unwrap_or(0);
        for s in &stamps {
            let us = |a: u64, b: u64| (b as f64 - a as f64) / 1e3;
            row.total_us += us(s.entry, s.returned);
            row.library_us += us(s.entry, s.framed);
            row.framing_us += us(s.gathered, s.framed);
            row.send_us += us(s.framed, s.sent);
            row.wait_peers_us += us(s.framed, last_framed);
            row.network_us += us(last_framed, first_result);
            row.wake_us += us(first_result, s.result);
            row.return_us += us(s.result, s.returned);
            row.blocked_per_call += f64::from(s.blocked);
            samples += 1.0;
        }
        row.calls += 1;
    }
    if samples > 0.0 {
        for v in [
            &mut row.total_us,
            &mut row.library_us,
            &mut row.framing_us,
            &mut row.send_us,
            &mut row.wait_peers_us,
            &mut row.network_us,
            &mut row.wake_us,
            &mut row.return_us,
            &mut row.blocked_per_call,
        ] {
            *v /= samples;
        }
    }
    row
}

/// A leader's stamps of a call that went through the network.
struct Stamped {
    entry: u64,
    gathered: u64,
    framed: u64,
    sent: u64,
    result: u64,
    returned: u64,
    blocked: u32,
}

impl Stamped {
    fn of(c: &CallStamps) -> Option<Self> {
        Some(Self {
            entry: c.get(Stage::Entry)?,
            gathered: c.get(Stage::Gathered)?,
            framed: c.get(Stage::Framed)?,
            sent: c.get(Stage::Sent)?,
            result: c.get(Stage::Result)?,
            returned: c.get(Stage::Returned)?,
            blocked: c.blocked,
        })
    }
}

/// Run count and run time of innet's XDP programs, summed.
#[derive(Clone, Copy, Debug, Default)]
struct XdpStats {
    runs: u64,
    nanos: u64,
}

impl XdpStats {
    fn now() -> Self {
        loaded_programs()
            .filter_map(Result::ok)
            .filter(|p| p.name_as_str().is_some_and(|n| n.starts_with("innet_")))
            .fold(Self::default(), |acc, p| Self {
                runs: acc.runs + p.run_count(),
                nanos: acc.nanos + u64::try_from(p.run_time().as_nanos()).unwrap_or(0),
            })
    }

    fn since(&self, before: &Self) -> Self {
        Self {
            runs: self.runs.saturating_sub(before.runs),
            nanos: self.nanos.saturating_sub(before.nanos),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stamps at whole microseconds from `t0`: entry, gathered, framed, sent, result, return.
    fn call(t: [u64; 6]) -> CallStamps {
        let mut c = CallStamps::default();
        c.at = t.map(|us| 1_000_000 + us * 1_000);
        c
    }

    #[test]
    fn the_terms_add_up_to_the_latency() {
        // Leader 0's packet is built at 2 µs, leader 1's at 4; the first result comes at 9,
        // the second at 11.
        let a = [call([0, 1, 2, 3, 9, 10])];
        let b = [call([1, 2, 4, 5, 11, 13])];
        let row = split(&[&a, &b]);
        assert_eq!(row.calls, 1);
        let sum = row.library_us + row.wait_peers_us + row.network_us + row.wake_us + row.return_us;
        assert!(
            (sum - row.total_us).abs() < 1e-9,
            "{sum} vs {}",
            row.total_us
        );
        assert!((row.total_us - 11.0).abs() < 1e-9, "(10 + 12) / 2");
        assert!(
            (row.network_us - 5.0).abs() < 1e-9,
            "last built 4 → first result 9"
        );
        assert!((row.wait_peers_us - 1.0).abs() < 1e-9, "(2 + 0) / 2");
        assert!(
            (row.send_us - 1.0).abs() < 1e-9,
            "both system calls took 1 µs"
        );
        assert!((row.wake_us - 1.0).abs() < 1e-9, "(0 + 2) / 2");
    }

    #[test]
    fn calls_on_the_host_path_are_left_out() {
        let host = CallStamps::default();
        let a = [call([0, 1, 2, 3, 9, 10]), host];
        let b = [call([1, 2, 4, 5, 11, 13]), call([0, 1, 2, 3, 4, 5])];
        assert_eq!(split(&[&a, &b]).calls, 1);
    }
}
