//! A host outside a running job attacks it (issue 44). The job, one rank per node on every
//! node but the last, checked allreduces back to back: library ranks, or an unmodified MPI
//! program (`steady_allreduce`, OpenMPI's multi-node launch) with innet's interposer
//! preloaded as users run it. The attacker: the last node's host, beside a member on its
//! TOR, with a packet socket and any source address it likes, knowing the job's wire id
//! (and, for library ranks, its partition key). Each attack runs for the whole job; a
//! control run without one gives the unattacked speed.
//!
//! Per attack the row says what the job suffered (wrong results, calls off the network,
//! regroups, its speed under attack against its own quiet spells, the memory of the ranks'
//! process and the daemons at their peak) and which counter named the attack (its increase
//! during the run). The attack runs in spells of 500 ms with a quiet spell after each.

use std::{
    net::Ipv4Addr,
    sync::atomic::{AtomicBool, AtomicU32, Ordering},
    time::{Duration, Instant, SystemTime},
};

use innet::stats;
use innet_client::{
    Layout, Mode, Refusals,
    endpoint::{STEP_FINAL, STEP_NACK, STEP_REGROUP},
    frames::job_pkey,
};
use innet_common::{
    proto::{COMM_TYPE_ALLREDUCE, PacketKind, QNH_RESPONSE},
    stats::{DaemonStats, PortStats},
    wire::{ControlPath, ControlPayload, ETH_LEN, IPV4_LEN, PathHop},
};
use innet_net::netdev::{PacketSocket, ifindex};

use super::{
    HostileRow,
    fabric::WiredFabric,
    steady::{STEADY_ALLREDUCE, Windows, steady_allreduce},
    vanish,
};
use crate::attack::{Disguise, disguised, forged_control, forged_data, forged_host_frame};
use innet_lab::{
    daemons::installed,
    job::{job_id, run_job_as},
    mpi::{Flavour, MpiRun, Nodes, reports},
    topology::{Host, Switch, Topology},
};

mod forge;
mod mpi_runs;

use forge::{Target, attack_until, fabric_ports, not_member, own_rss_kib, port_counters};
use mpi_runs::{run_one_mpi, tally};

/// What the attacker does, all run long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attack {
    /// Nothing: the control run.
    None,
    /// Forged contributions (from a member's address: "the group vanished") and results
    /// (from the TOR's address, every round) of the job's group, in `Disguise`.
    Forgery(Disguise),
    /// Data to the attacker's TOR's address for every wire id in turn: which groups does it
    /// hold (a group-lost notice says "not this one"), and a flood of notices back.
    WireIdScan,
    /// Host-to-host frames in leader 0's name (its rank, the job's partition key) to every
    /// other leader: regroup notices of generation `u32::MAX` ("stay on the hosts"), final
    /// results and NACKs, for the collectives around the current ones. `spoofed`: from
    /// leader 0's address; else from the attacker's own.
    HostFrames { spoofed: bool },
    /// Queries under fresh wire ids, from the attacker's own address, as fast as a burst
    /// goes (200 every 5 ms): the daemon's queue of control frames, which every port's
    /// set-ups share.
    ControlFlood,
    /// The same flood's frames to a UDP port no one serves: what a flood at that rate
    /// costs the job on this lab's shared CPUs whatever innet does with it (the sender,
    /// the veth pairs, the bridges), the floor of the row above.
    PlainFlood,
    /// The job's group taken over by its wire id: a query under another high byte (to
    /// itself, so the attacker is the set-up's MRR), a notify naming the TOR with three
    /// members, and a kill, from the attacker's own address (issue 44 item 3).
    Hijack,
}

impl Attack {
    /// Every attack, the control run (spells of nothing: the measure's noise) first.
    pub const ALL: [Self; 12] = [
        Self::None,
        Self::Forgery(Disguise::Plain),
        Self::Forgery(Disguise::IpOptions),
        Self::Forgery(Disguise::Vlan0),
        Self::Forgery(Disguise::Fragments),
        Self::Forgery(Disguise::HandoffMac),
        Self::WireIdScan,
        Self::HostFrames { spoofed: true },
        Self::HostFrames { spoofed: false },
        Self::ControlFlood,
        Self::PlainFlood,
        Self::Hijack,
    ];

    #[must_use]
    pub fn name(self) -> String {
        match self {
            Self::None => "nothing (control run)".into(),
            Self::Forgery(d) => format!("forged contributions and results, {}", d.name()),
            Self::WireIdScan => "wire-id scan to the TOR's address".into(),
            Self::HostFrames { spoofed: true } => {
                "forged regroup notices, finals and NACKs, a leader's address".into()
            }
            Self::HostFrames { spoofed: false } => {
                "forged regroup notices, finals and NACKs, own address".into()
            }
            Self::ControlFlood => "a flood of queries under fresh wire ids".into(),
            Self::PlainFlood => "the same flood to a UDP port no one serves (the floor)".into(),
            Self::Hijack => "queries, notifies and kills under the job's wire id".into(),
        }
    }

    /// The counter that names this attack where the attacker's frames enter the fabric.
    #[must_use]
    pub const fn counter(self) -> &'static str {
        match self {
            Self::None => "",
            Self::Forgery(Disguise::Plain) => "not_member (group, every switch)",
            Self::Forgery(Disguise::IpOptions) => "mal_layout (attacker's port)",
            // A port that strips tags before XDP (a wire's tc redirect here, a NIC's VLAN
            // offload) shows XDP the frame untagged: it is member-checked like any other.
            Self::Forgery(Disguise::Vlan0) => "mal_layout (attacker's port) + not_member",
            Self::Forgery(Disguise::Fragments) => "mal_fragment (attacker's port)",
            Self::Forgery(Disguise::HandoffMac) => "mal_handoff (attacker's port)",
            Self::WireIdScan => "lost_notices_limited (attacker's port)",
            // Dropped where the address is bound: the member's TOR, or a switch above it.
            Self::HostFrames { spoofed: true } => "spoofed_source (every switch)",
            Self::HostFrames { spoofed: false } => "host_frame_spoofed (ranks' refusals)",
            Self::ControlFlood => "control_over_share (attacker's port)",
            Self::PlainFlood => "non_roce (attacker's port)",
            Self::Hijack => "refused_comm_clash + refused_not_mrr (attacker's TOR's daemon)",
        }
    }
}

/// Who runs the attacked job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Job {
    /// innet's client library, a rank per thread of the campaign's process.
    Library,
    /// `steady_allreduce` under OpenMPI's multi-node launch, the interposer preloaded with
    /// nothing set but its report (placement found at `MPI_Init`, learning off so every
    /// allreduce is innet's to serve).
    Mpi,
}

impl Job {
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Library => "library ranks",
            Self::Mpi => "MPI + interposer",
        }
    }

    /// Whether `attack` runs against this job. The host-frame forgeries need the job's
    /// partition key, which an MPI job draws at random at `MPI_Init` and only its host
    /// frames carry (none leave the job's tree); the interposer's host frames go through
    /// the same client code as the library ranks', whose rows forge them with the key known.
    #[must_use]
    pub const fn faces(self, attack: Attack) -> bool {
        !matches!((self, attack), (Self::Mpi, Attack::HostFrames { .. }))
    }
}

/// How long each run's job lasts, whether MPI jobs are attacked too, and which attacks run
/// (`only`: those whose name contains it, and the control run).
#[derive(Clone, Debug)]
pub struct AttackPlan {
    pub run: Duration,
    pub mpi: bool,
    pub only: Option<String>,
}

impl AttackPlan {
    fn runs(&self, attack: Attack) -> bool {
        attack == Attack::None
            || self
                .only
                .as_ref()
                .is_none_or(|text| attack.name().contains(text.as_str()))
    }
}

/// Every attack on `fabric`, after a control run: against library ranks, then (`plan.mpi`)
/// against an MPI job.
#[must_use]
pub fn run(fabric: &WiredFabric, plan: &AttackPlan) -> Vec<HostileRow> {
    let attacks = || Attack::ALL.into_iter().filter(|&a| plan.runs(a));
    let mut rows: Vec<HostileRow> = attacks().map(|a| run_one(fabric, a, plan)).collect();
    if plan.mpi {
        rows.extend(
            attacks()
                .filter(|&a| Job::Mpi.faces(a))
                .map(|a| run_one_mpi(fabric, a, plan)),
        );
    }
    rows
}

/// The attacker: the last node's first host.
fn attacker(topo: &Topology) -> &Host {
    let nodes = topo.hosts.len() / topo.shape.sockets;
    topo.host(nodes - 1, 0)
}

/// `attack`'s row on `job` before it runs.
fn new_row(topo: &Topology, attack: Attack, job: Job) -> HostileRow {
    HostileRow {
        attack: attack.name(),
        job: job.name().into(),
        levels: topo.shape.levels,
        control: attack == Attack::None,
        counter: attack.counter().into(),
        ..HostileRow::default()
    }
}

fn run_one(fabric: &WiredFabric, attack: Attack, plan: &AttackPlan) -> HostileRow {
    let topo = &fabric.topo;
    let nodes = topo.hosts.len() / topo.shape.sockets - 1;
    let me = attacker(topo);
    let my_tor = &topo.tors[me.tor];
    let mut row = new_row(topo, attack, Job::Library);
    let old = vanish::groups_on(&topo.tors[0]);
    let job = job_id();
    let before = before_row(topo, me);
    let done = AtomicBool::new(false);
    let group_id = AtomicU32::new(0);
    let mut peaks = (0u64, 0u64, 0u64);
    let mut group = None;
    let mut spells = vec![];
    let out = std::thread::scope(|s| {
        let ranks = s.spawn(|| {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run_job_as(
                    topo,
                    job,
                    Layout::new(nodes, 1, 1).expect("layout"),
                    Mode::IncNode,
                    |_| {},
                    |comm| {
                        let out = vanish::library_body(comm, plan.run, true);
                        (out, comm.refusals())
                    },
                )
            }));
            done.store(true, Ordering::SeqCst);
            r
        });
        // Memory peaks, and the group's counters while it exists (the job's end frees it).
        let sampler = s.spawn(|| {
            let mut peaks = (0, 0, 0);
            while !done.load(Ordering::SeqCst) {
                peaks.0 = peaks.0.max(own_rss_kib());
                peaks.1 = peaks.1.max(fabric.state().1);
                let id = group_id.load(Ordering::SeqCst);
                if id != 0 {
                    peaks.2 = peaks.2.max(not_member(topo, id));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            peaks
        });
        group =
            vanish::new_group(&[&topo.tors[0]], &old, Duration::from_secs(30)).map(|(_, id)| id);
        group_id.store(group.unwrap_or(0), Ordering::SeqCst);
        if let Some(id) = group {
            wait_for_install(attack, my_tor, id);
            let target = Target {
                id,
                members: (0..nodes).map(|n| topo.host(n, 0).ip).collect(),
                tor: my_tor.ip,
                pkey: job_pkey(job),
                me: me.ip,
            };
            (row.frames_sent, spells) = me.ns.run(|| attack_until(attack, &target, &done));
        }
        peaks = sampler.join().expect("the sampler");
        ranks.join().expect("the job's thread")
    });
    (row.ranks_rss_kib_peak, row.daemons_rss_kib_peak) = (peaks.0, peaks.1);
    let Ok(out) = out else {
        row.first_error = Some("a rank panicked".into());
        return row;
    };
    let mut refusals = Refusals::default();
    for (_, r) in &out {
        refusals.host_frame_spoofed += r.host_frame_spoofed;
    }
    let out: Vec<(u64, Vec<vanish::Call>)> = out.into_iter().map(|(o, _)| o).collect();
    let e = evidence(topo, me, &before, peaks.2, refusals.host_frame_spoofed);
    row.counted = counted(attack, &e);

    tally(&mut row, &out, &spells);
    row
}

/// What the fabric and the ranks counted during a row.
struct Evidence {
    /// The attacker's port on its TOR.
    port: PortStats,
    /// The peak `not_member` of the job's group, summed over the switches.
    not_member: u64,
    /// `spoofed_source` over every port of the fabric.
    spoofed: u64,
    /// The ranks' refused host frames.
    refused: u64,
    /// The attacker's TOR's daemon.
    daemon: DaemonStats,
}

/// What the counters say before a row: the attacker's port, the fabric's ports, its TOR's
/// daemon.
fn before_row(topo: &Topology, me: &Host) -> (PortStats, PortStats, DaemonStats) {
    let my_tor = &topo.tors[me.tor];
    (
        port_counters(my_tor, me.tor_port),
        fabric_ports(topo),
        stats::read_daemon(&my_tor.pins.layout).unwrap_or_default(),
    )
}

/// What was counted since `before` ([`before_row`]).
fn evidence(
    topo: &Topology,
    me: &Host,
    before: &(PortStats, PortStats, DaemonStats),
    not_member: u64,
    refused: u64,
) -> Evidence {
    let my_tor = &topo.tors[me.tor];
    Evidence {
        port: port_counters(my_tor, me.tor_port).since(&before.0),
        not_member,
        spoofed: fabric_ports(topo).spoofed_source - before.1.spoofed_source,
        refused,
        daemon: stats::read_daemon(&my_tor.pins.layout)
            .unwrap_or_default()
            .since(&before.2),
    }
}

/// Why an MPI job's calls left the network, from the interposer's reports: the reasons
/// it did not serve the job or a communicator, and the calls it handed to MPI by reason.
fn why_off_the_network(summaries: &[innet_mpi::rank_report::Summary]) -> String {
    let mut reasons: Vec<String> = summaries
        .iter()
        .filter_map(|s| s.not_served.clone())
        .collect();
    reasons.sort();
    reasons.dedup();
    let passed: Vec<String> = summaries
        .first()
        .map(|s| s.passed.iter().map(|(k, n)| format!("{k} {n}")).collect())
        .unwrap_or_default();
    let fallbacks: u64 = summaries.iter().map(|s| s.fallbacks).sum();
    let mut by_reason = std::collections::BTreeMap::<&str, u64>::new();
    for (reason, n) in summaries.iter().flat_map(|s| &s.fell_back) {
        *by_reason.entry(reason).or_default() += n;
    }
    format!(
        "off the network: not served: {reasons:?}; rank 0 passed to MPI: [{}]; fallbacks {fallbacks} {by_reason:?}",
        passed.join(", ")
    )
}

/// The hijack takes over an installed group (issue 44 item 3): it starts once the group is
/// installed on the attacker's TOR too. (A query under the job's id during the set-up is
/// left out of the group for want of its set-up key: `tests/hostile_e2e.rs`.)
fn wait_for_install(attack: Attack, my_tor: &Switch, id: u32) {
    if attack != Attack::Hijack {
        return;
    }
    let start = Instant::now();
    while installed(my_tor, id).is_none() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// How much the counter that names `attack` rose.
fn counted(attack: Attack, e: &Evidence) -> u64 {
    match attack {
        Attack::None => 0,
        Attack::Forgery(Disguise::Plain) => e.not_member,
        Attack::Forgery(Disguise::IpOptions) => e.port.mal_layout,
        Attack::Forgery(Disguise::Vlan0) => e.port.mal_layout + e.not_member,
        Attack::Forgery(Disguise::Fragments) => e.port.mal_fragment,
        Attack::Forgery(Disguise::HandoffMac) => e.port.mal_handoff,
        Attack::WireIdScan => e.port.lost_notices_limited,
        Attack::HostFrames { spoofed: true } => e.spoofed,
        Attack::HostFrames { spoofed: false } => e.refused,
        Attack::ControlFlood => e.port.control_over_share,
        Attack::PlainFlood => e.port.non_roce,
        Attack::Hijack => e.daemon.refused_comm_clash + e.daemon.refused_not_mrr,
    }
}

#[cfg(test)]
mod tests {
    use super::mpi_runs::per_call_us;

    #[test]
    fn the_median_window_gives_the_time_per_call() {
        assert!((per_call_us(&[10, 20, 10]) - 10_000.0).abs() < 1e-9);
        assert!(per_call_us(&[]).abs() < 1e-9);
    }
}
