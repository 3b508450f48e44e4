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
    pub const ALL: [Self; 11] = [
        Self::None,
        Self::Forgery(Disguise::Plain),
        Self::Forgery(Disguise::IpOptions),
        Self::Forgery(Disguise::Vlan0),
        Self::Forgery(Disguise::Fragments),
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
    format!(
        "off the network: not served: {reasons:?}; rank 0 passed to MPI: [{}]; fallbacks {fallbacks}",
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
        Attack::WireIdScan => e.port.lost_notices_limited,
        Attack::HostFrames { spoofed: true } => e.spoofed,
        Attack::HostFrames { spoofed: false } => e.refused,
        Attack::ControlFlood => e.port.control_over_share,
        Attack::PlainFlood => e.port.non_roce,
        Attack::Hijack => e.daemon.refused_comm_clash + e.daemon.refused_not_mrr,
    }
}

/// One attack on an MPI job ([`Job::Mpi`]): `steady_allreduce` counts its calls per 100 ms
/// window, and the windows inside the attack's spells are compared with those outside them
/// (the program prints the wall clock its windows start at). Calls off the network come
/// from the interposer's reports, set-ups from the group ids the first TOR held during the
/// run, the ranks' memory from their processes.
fn run_one_mpi(fabric: &WiredFabric, attack: Attack, plan: &AttackPlan) -> HostileRow {
    let topo = &fabric.topo;
    let nodes = topo.hosts.len() / topo.shape.sockets - 1;
    let me = attacker(topo);
    let my_tor = &topo.tors[me.tor];
    let mut row = new_row(topo, attack, Job::Mpi);
    let dir = std::env::temp_dir().join(format!("innet-hostile-{}", innet_lab::unique_id()));
    let reports_dir = dir.join("reports");
    std::fs::create_dir_all(&reports_dir).expect("the scratch directory");
    let program = steady_allreduce(Flavour::OpenMpi, plan.run);
    let mpirun = MpiRun::new(Flavour::OpenMpi, nodes, &program)
        .multi_node(Nodes::uneven(topo, &vec![1; nodes]))
        .without_placement_file()
        .env(innet_mpi::session::LEARN_VAR, "0")
        .env("INNET_MPI_REPORT", &reports_dir);
    let old = vanish::groups_on(&topo.tors[0]);
    let before = before_row(topo, me);
    let child = mpirun.spawn_captured();
    let done = AtomicBool::new(false);
    let group_id = AtomicU32::new(0);
    let mut spells = vec![];
    let (out, peaks, groups) = std::thread::scope(|s| {
        let job = s.spawn(|| {
            let out = child.wait_with_output();
            done.store(true, Ordering::SeqCst);
            out
        });
        // Memory peaks, the group's counters, and every group the first TOR held.
        let sampler = s.spawn(|| {
            let (mut peaks, mut groups) = ((0, 0, 0), vec![]);
            while !done.load(Ordering::SeqCst) {
                peaks.0 = peaks.0.max(rss_of_processes(STEADY_ALLREDUCE));
                peaks.1 = peaks.1.max(fabric.state().1);
                let id = group_id.load(Ordering::SeqCst);
                if id != 0 {
                    peaks.2 = peaks.2.max(not_member(topo, id));
                }
                for g in vanish::groups_on(&topo.tors[0]) {
                    if !old.contains(&g) && !groups.contains(&g) {
                        groups.push(g);
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            (peaks, groups)
        });
        let group = vanish::new_group(&[&topo.tors[0]], &old, Duration::from_secs(30));
        if let Some((_, id)) = group {
            group_id.store(id, Ordering::SeqCst);
            wait_for_install(attack, my_tor, id);
            let target = Target {
                id,
                members: (0..nodes).map(|n| topo.host(n, 0).ip).collect(),
                tor: my_tor.ip,
                // Not known to the attacker, and not used by the attacks an MPI job faces.
                pkey: 0,
                me: me.ip,
            };
            (row.frames_sent, spells) = me.ns.run(|| attack_until(attack, &target, &done));
        }
        let (peaks, groups) = sampler.join().expect("the sampler");
        (job.join().expect("mpirun's waiter"), peaks, groups)
    });
    (row.ranks_rss_kib_peak, row.daemons_rss_kib_peak) = (peaks.0, peaks.1);
    row.counted = counted(attack, &evidence(topo, me, &before, peaks.2, 0));
    row.regroups = groups.len().saturating_sub(1) as u64;
    tally_mpi(&mut row, out, &spells, &reports_dir, nodes);
    // A row that fails keeps the interposer's reports for a look.
    if row.failed() {
        eprintln!(
            "{}: the interposer's reports are kept in {}",
            row.attack,
            dir.display()
        );
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    row
}

/// What an MPI job's run says: its exit and output (`steady_allreduce`'s windows), the
/// interposer's reports (calls off the network), the speed of the windows inside the
/// attack's spells against those outside.
fn tally_mpi(
    row: &mut HostileRow,
    out: std::io::Result<std::process::Output>,
    spells: &[(Instant, Instant)],
    reports_dir: &std::path::Path,
    nodes: usize,
) {
    let out = match out {
        Ok(out) if out.status.success() => out,
        Ok(out) => {
            row.first_error = Some(vanish::first_lines(&out.stderr));
            return;
        }
        Err(e) => {
            row.first_error = Some(format!("mpirun: {e}"));
            return;
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let Some(windows) = Windows::parse(&stdout) else {
        row.first_error = Some("steady_allreduce printed no windows".into());
        return;
    };
    row.ran = true;
    (row.calls, row.wrong) = (windows.calls, windows.wrong);
    let summaries = reports(reports_dir, nodes);
    if let Some(first) = summaries.first() {
        let passed: u64 = first
            .passed
            .iter()
            .filter(|(k, _)| k.starts_with("allreduce/"))
            .map(|(_, n)| n)
            .sum();
        row.off_network = passed + summaries.iter().map(|s| s.fallbacks).sum::<u64>();
        if row.off_network > 0 {
            row.first_error = Some(why_off_the_network(&summaries));
        }
    }
    let spells = wall_clock(spells);
    let in_spell =
        |from: SystemTime, to: SystemTime| spells.iter().any(|&(a, b)| a <= from && to <= b);
    let outside =
        |from: SystemTime, to: SystemTime| spells.iter().all(|&(a, b)| to <= a || b <= from);
    let (under, quiet) = windows.split(in_spell, outside);
    set_speed(row, per_call_us(&under), per_call_us(&quiet));
    // The slowest whole 100 ms window (not the first or the last, partial), as the time
    // per call in it.
    row.slowest_call_ms = windows
        .whole()
        .iter()
        .map(|&c| {
            let ms = Windows::WIDTH.as_secs_f64() * 1e3;
            if c == 0 { ms } else { ms / c as f64 }
        })
        .fold(0.0, f64::max);
}

/// `spells` on the wall clock (what `steady_allreduce` prints), from one reading of both
/// clocks.
fn wall_clock(spells: &[(Instant, Instant)]) -> Vec<(SystemTime, SystemTime)> {
    let (now, wall_now) = (Instant::now(), SystemTime::now());
    let wall = |at: Instant| {
        if at <= now {
            wall_now - (now - at)
        } else {
            wall_now + (at - now)
        }
    };
    spells.iter().map(|&(a, b)| (wall(a), wall(b))).collect()
}

/// The median window's time per call, µs (0 without windows).
fn per_call_us(counts: &[u64]) -> f64 {
    let mut sorted = counts.to_vec();
    sorted.sort_unstable();
    match sorted.get(sorted.len() / 2) {
        Some(&c) if c > 0 => Windows::WIDTH.as_secs_f64() * 1e6 / c as f64,
        _ => 0.0,
    }
}

/// Resident memory of every process named `name`, summed (KiB).
fn rss_of_processes(name: &str) -> u64 {
    // The kernel keeps 15 bytes of a process's name.
    let name = &name[..name.len().min(15)];
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == name)
        })
        .filter_map(innet_lab::daemons::rss_kib)
        .sum()
}

/// What the job's ranks saw: wrong results, calls off the network, regroups, and the speed
/// of the attacked spells against the quiet ones.
fn tally(row: &mut HostileRow, out: &[(u64, Vec<vanish::Call>)], spells: &[(Instant, Instant)]) {
    row.ran = true;
    row.wrong = out.iter().map(|(w, _)| *w).sum();
    // A collective counts as off the network when any rank ran it on the hosts.
    let calls = &out[0].1;
    row.calls = calls.len() as u64;
    row.off_network = (0..calls.len())
        .filter(|&k| {
            out.iter()
                .any(|(_, c)| c.get(k).is_some_and(|c| !c.network))
        })
        .count() as u64;
    row.regroups = calls.iter().filter(|c| c.regrouped.is_some()).count() as u64;
    let attacked = |c: &vanish::Call| spells.iter().any(|&(a, b)| c.start >= a && c.start < b);
    let (under, quiet): (Vec<_>, Vec<_>) = calls.iter().partition(|c| attacked(c));
    set_speed(row, median_us(&under), median_us(&quiet));
    row.slowest_call_ms = calls
        .iter()
        .map(|c| c.took.as_secs_f64() * 1e3)
        .fold(0.0, f64::max);
}

/// The row's median call under attack and in the quiet spells (µs), and its speed: the
/// quiet one over the attacked one (0 without attacked calls).
fn set_speed(row: &mut HostileRow, attacked_us: f64, quiet_us: f64) {
    (row.median_call_us, row.quiet_median_call_us) = (attacked_us, quiet_us);
    row.speed = if attacked_us > 0.0 {
        quiet_us / attacked_us
    } else {
        0.0
    };
}

/// The median of `calls`' durations, µs (0 for none).
fn median_us(calls: &[&vanish::Call]) -> f64 {
    let mut us: Vec<f64> = calls.iter().map(|c| c.took.as_secs_f64() * 1e6).collect();
    us.sort_by(f64::total_cmp);
    us.get(us.len() / 2).copied().unwrap_or(0.0)
}

/// What the attacker knows of the job.
struct Target {
    id: u32,
    members: Vec<Ipv4Addr>,
    tor: Ipv4Addr,
    pkey: u16,
    /// The attacker's own address.
    me: Ipv4Addr,
}

/// Bursts a second, and forgeries per burst: 200 × 12 = 2,400 forgeries/s (the attack
/// tried on LAMMPS sent a burst every 5 ms), a rate that leaves the lab's 2 CPUs to the job,
/// so a row's speed shows what the frames do more than what sending them costs.
const BURST_EVERY: Duration = Duration::from_millis(5);
const ROUNDS_PER_BURST: usize = 4;

/// The forgeries of `attack` for round `r` (each one frame, or its fragments).
fn forgeries(attack: Attack, t: &Target, r: u8) -> Vec<Vec<Vec<u8>>> {
    let Attack::Forgery(disguise) = attack else {
        return vec![];
    };
    // A stray contribution from leader 0 ("the group vanished"), and a result from leader
    // 0's address (where a switch's results come from) to every other member.
    let stray = (t.members[1], false);
    let results = t.members[1..].iter().map(|&m| (m, true));
    std::iter::once(stray)
        .chain(results)
        .enumerate()
        .map(|(k, (dst, result))| {
            let f = forged_data(t.id, t.members[0], dst, r, result);
            disguised(&f, disguise, u16::from(r) << 4 | k as u16)
        })
        .collect()
}

/// Queries per burst of [`Attack::ControlFlood`]: 40,000 a second while a spell lasts.
const FLOOD_PER_BURST: usize = 200;

/// [`Attack::Hijack`]'s frames for `comm` (the job's wire id under another high byte): a
/// query to itself (so the attacker is the set-up's MRR), a notify naming its TOR with three
/// members, a kill.
fn hijack(t: &Target, comm: u32) -> [(PacketKind, ControlPayload); 3] {
    let body = |hop: Option<u8>| {
        let mut c = ControlPayload {
            sup_comm_type: COMM_TYPE_ALLREDUCE,
            ..ControlPayload::default()
        };
        c.set_true_comm_id(comm);
        if let Some(children) = hop {
            let mut path = ControlPath::default();
            path.push(PathHop::in_tree(u32::from(t.tor), 0, children));
            c.path = path;
            c.query_notify_hop = QNH_RESPONSE;
        }
        c
    };
    [
        (PacketKind::Query, body(None)),
        (PacketKind::Notify, body(Some(3))),
        (PacketKind::Kill, body(Some(1))),
    ]
}

/// The attack runs in spells of this long, a quiet spell of the same length after each:
/// the job's speed under attack is compared with its speed in its own quiet spells, which
/// on a 2-CPU machine whose runs differ by tens of percent is the only steady reference.
const SPELL: Duration = Duration::from_millis(500);

/// Leader 0's host frames for collective `seq` (each in turn: the attacker does not know
/// which collective the job is in) to every other leader: a regroup notice of generation
/// `u32::MAX`, a final result, a NACK of step 0.
fn host_forgeries(t: &Target, seq: u32, spoofed: bool) -> Vec<Vec<Vec<u8>>> {
    let src = if spoofed { t.members[0] } else { t.me };
    let result = [0x55u8; 68];
    t.members[1..]
        .iter()
        .flat_map(|&dst| {
            [
                (STEP_REGROUP, &u32::MAX.to_le_bytes()[..]),
                (STEP_FINAL, &result[..]),
                (STEP_NACK, &[0u8][..]),
            ]
            .map(|(step, body)| {
                vec![forged_host_frame(
                    t.pkey,
                    (0, src),
                    dst,
                    (seq, step),
                    0,
                    body,
                )]
            })
        })
        .collect()
}

/// Sends `attack` in bursts every [`BURST_EVERY`], in spells, until `done`; the forgeries
/// sent and the spells (start, end). Runs in the attacker's namespace.
fn attack_until(attack: Attack, t: &Target, done: &AtomicBool) -> (u64, Vec<(Instant, Instant)>) {
    let raw = PacketSocket::new().expect("packet socket");
    let eth0 = ifindex("eth0").expect("eth0");
    let emit = |pieces: &[Vec<u8>]| pieces.iter().all(|p| raw.send(eth0, p).is_ok());
    let by_round: Vec<Vec<Vec<Vec<u8>>>> = (0..=255u8).map(|r| forgeries(attack, t, r)).collect();
    let (mut sent, mut round, mut next_id) = (0u64, 0usize, 1u32);
    let mut spells = vec![];
    let attack_start = Instant::now();
    let mut spell_start = attack_start;
    while !done.load(Ordering::SeqCst) {
        let now = Instant::now();
        if now - spell_start >= 2 * SPELL {
            spells.push((spell_start, spell_start + SPELL));
            spell_start = now;
        }
        if now - spell_start >= SPELL {
            std::thread::sleep(BURST_EVERY);
            continue;
        }
        match attack {
            Attack::None => {}
            Attack::Forgery(_) => {
                for _ in 0..ROUNDS_PER_BURST {
                    for forgery in &by_round[round] {
                        sent += u64::from(emit(forgery));
                    }
                    round = (round + 1) % by_round.len();
                }
            }
            Attack::HostFrames { spoofed } => {
                // Around the collective the job is in, by its pace (about 10 a ms here).
                let guess = (attack_start.elapsed().as_millis() as u32).saturating_mul(10);
                for k in 0..2 {
                    let seq = (guess + (round as u32 * 2 + k) % 128).saturating_sub(64);
                    for forgery in host_forgeries(t, seq, spoofed) {
                        sent += u64::from(emit(&forgery));
                    }
                }
                round = (round + 1) % 64;
            }
            Attack::ControlFlood | Attack::PlainFlood => {
                for _ in 0..FLOOD_PER_BURST {
                    let mut q = ControlPayload::default();
                    q.set_true_comm_id(0x9900_0000 ^ next_id.wrapping_mul(2_654_435_761));
                    let mut f = forged_control(PacketKind::Query, (t.me, t.members[1]), 1, &q);
                    if attack == Attack::PlainFlood {
                        // UDP port 9 (discard), the UDP checksum off.
                        let udp = ETH_LEN + IPV4_LEN;
                        f[udp + 2..udp + 4].copy_from_slice(&9u16.to_be_bytes());
                        f[udp + 6..udp + 8].fill(0);
                    }
                    sent += u64::from(emit(&[f]));
                    next_id = next_id.wrapping_add(1);
                }
            }
            Attack::Hijack => {
                for _ in 0..ROUNDS_PER_BURST {
                    // Every high byte in turn: the job's own is refused as a late query.
                    let comm = (next_id % 0xff + 1) << 24 | t.id;
                    next_id = next_id.wrapping_add(1);
                    for (kind, frame) in hijack(t, comm) {
                        sent += u64::from(emit(&[forged_control(kind, (t.me, t.me), 3, &frame)]));
                    }
                }
            }
            Attack::WireIdScan => {
                for _ in 0..3 * ROUNDS_PER_BURST {
                    let f = forged_data(next_id, t.members[0], t.tor, 0, false);
                    sent += u64::from(emit(&[f]));
                    next_id = (next_id % 0x00ff_fffe) + 1;
                    // Ids ending in 0xff are control ids, no group's.
                    if next_id & 0xff == 0xff {
                        next_id += 1;
                    }
                }
            }
        }
        std::thread::sleep(BURST_EVERY);
    }
    let end = Instant::now().min(spell_start + SPELL);
    spells.push((spell_start, end));
    (sent, spells)
}

/// `not_member` of group `id`, summed over every switch that holds it.
fn not_member(topo: &Topology, id: u32) -> u64 {
    topo.switches()
        .filter_map(|sw| installed(sw, id))
        .map(|g| g.stats.not_member)
        .sum()
}

/// The counters of port `ifindex` of `sw`.
fn port_counters(sw: &Switch, ifindex: u32) -> PortStats {
    stats::read(&sw.pins.layout)
        .unwrap_or_default()
        .into_iter()
        .find(|p| p.ifindex == ifindex)
        .map(|p| p.total)
        .unwrap_or_default()
}

/// Every switch port's counters, summed.
fn fabric_ports(topo: &Topology) -> PortStats {
    let mut sum = PortStats::default();
    for sw in topo.switches() {
        for p in stats::read(&sw.pins.layout).unwrap_or_default() {
            sum.accumulate(&p.total);
        }
    }
    sum
}

/// This process's resident memory (KiB): the ranks are its threads.
fn own_rss_kib() -> u64 {
    innet_lab::daemons::rss_kib(std::process::id()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_window_gives_the_time_per_call() {
        assert!((per_call_us(&[10, 20, 10]) - 10_000.0).abs() < 1e-9);
        assert!(per_call_us(&[]).abs() < 1e-9);
    }
}
