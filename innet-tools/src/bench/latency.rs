//! The allreduce latency sweep, osu_allreduce-style: for each node count a namespace fabric
//! with `innet daemon` on every switch, a NIC daemon on every node and (for `inc-dpu`) a
//! DPU in front of every NIC running a DPU daemon; for each ranks-per-node
//! count and mode one job; for each size a warm-up, then timed iterations, every result
//! checked on every rank. All modes run on the same fabric in the same run, so the speed-ups
//! over `host-rd` compare like with like.

use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use innet::loader::XdpMode;
use innet_client::{
    Communicator, Cutover, Layout, Mode, Path, Report,
    cutover::{self, Measured},
};
use innet_common::{
    group::MAX_CHILDREN,
    proto::{Dtype, Op, element_bytes},
};

use super::{
    LatencyRow, STANDARD_MTU,
    cpu::{CpuCost, Snapshot},
    percentile,
};
use innet_common::fault::{KIND_CONTRIBUTION, KIND_RESULT};
use innet_lab::{
    NetNs,
    daemons::{daemons_on, dpu_daemons_on, learn_hosts, nic_daemons_on, with_window},
    job::{expected, input, path_name, run_job},
    shaping::{LinkMeter, LinkRate, LinkUse},
    topology::{Dir, Options, Shape, Topology},
    wire_faults::Faults,
};

/// Distinct inputs cycled through (expected results are computed once each).
const CASES: usize = 4;

/// What to sweep.
#[derive(Clone, Debug)]
pub struct Sweep {
    pub nodes: Vec<usize>,
    pub ppn: Vec<usize>,
    pub sizes: Vec<usize>,
    pub modes: Vec<Mode>,
    /// Timed iterations for sizes up to 256 B; larger sizes run fewer ([`iterations_for`]).
    pub iterations: usize,
    /// The reduction: int32 SUM for the latency sweep, float64 SUM for the goodput sweep
    /// (the inputs are small integers, so every summation order gives the reference's bits).
    pub op: Op,
    pub dtype: Dtype,
    /// Leaders' busy-poll budget (`None`: the library's default).
    pub spin: Option<Duration>,
    /// MTU of every link (`None`: 1500 B).
    pub mtu: Option<usize>,
    /// Every link shaped to this rate, both ways (`None`: the CPUs bind, not the links).
    pub link_rate: Option<LinkRate>,
    /// Every link drops this share of the INC data packets it carries, each way (`None`:
    /// none): contributions, partials, results and the host algorithms' messages.
    pub link_loss: Option<f64>,
    /// Slots per group on every switch and NIC (`None`: the default window).
    pub window: Option<u32>,
    /// How the switches' programs are attached (native unless a run compares).
    pub switch_mode: XdpMode,
    /// How deep the fabric is.
    pub fabric: Depth,
    /// Profile every case ([`super::cpu`]): rank 0 reads the machine's busy CPU and (with
    /// `kernel.bpf_stats_enabled` on) innet's XDP time before and after the timed calls.
    pub profile: bool,
}

impl Sweep {
    /// The (nodes, ppn, mode) jobs this sweep runs, in order; modes a layout cannot run
    /// (Socket mode with one rank per node) are left out.
    #[must_use]
    pub fn jobs(&self) -> Vec<(usize, usize, Mode)> {
        let mut jobs = vec![];
        for &n in &self.nodes {
            for &p in &self.ppn {
                for &m in &self.modes {
                    if runs(m, p) {
                        jobs.push((n, p, m));
                    }
                }
            }
        }
        jobs
    }

    /// Progress steps: one per (job, size).
    #[must_use]
    pub fn steps(&self) -> u64 {
        (self.jobs().len() * self.sizes.len()) as u64
    }
}

/// Whether `mode` can run with `ppn` ranks per node: Socket mode needs the ranks split evenly
/// over the 2 sockets.
#[must_use]
pub fn runs(mode: Mode, ppn: usize) -> bool {
    mode != Mode::IncSocket || (ppn >= 2 && ppn.is_multiple_of(2))
}

/// Timed iterations at `bytes`: `n` up to 256 B, a fifth up to 4 KiB, a fiftieth beyond
/// (osu_allreduce also runs fewer iterations for large messages).
#[must_use]
pub fn iterations_for(bytes: usize, n: usize) -> usize {
    match bytes {
        0..=256 => n,
        257..=4096 => (n / 5).max(10),
        _ => (n / 50).max(5),
    }
}

/// The fabric for `nodes` nodes (each with 2 sockets and a NIC per socket): the shapes of the
/// integration tests and of the paper's Fig. 8.
#[must_use]
pub fn shape_for(nodes: usize) -> Shape {
    let (tors, hosts_per_tor, spines) = match nodes {
        9 => (3, 3, 2),
        // A switch takes at most MAX_CHILDREN (16) children per group.
        n if n > 2 * MAX_CHILDREN && n.is_multiple_of(MAX_CHILDREN) => {
            (n / MAX_CHILDREN, MAX_CHILDREN, 1)
        }
        n if n.is_multiple_of(2) && n >= 4 => (2, n / 2, 1),
        n => (1, n, 1),
    };
    Shape::two_level(tors, hosts_per_tor, spines).with_sockets(2)
}

/// How deep the bench's fabrics are: `--levels`, and at 3 levels `--pods`, `--aggs` and
/// `--cores`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Depth {
    /// 1, 2 or 3 switch levels.
    pub levels: usize,
    /// Pods at 3 levels (`None`: [`Depth::shape`] picks).
    pub pods: Option<usize>,
    /// Aggregation switches per pod and core switches, at 3 levels.
    pub aggs: usize,
    pub cores: usize,
}

impl Default for Depth {
    fn default() -> Self {
        Self {
            levels: 2,
            pods: None,
            aggs: 2,
            cores: 2,
        }
    }
}

impl Depth {
    /// The fabric for `nodes` nodes (2 sockets each, a NIC per socket): one TOR (1
    /// level); [`shape_for`] (2 levels); at 3 levels TORs of at most 8 nodes and at most a
    /// quarter of the nodes, two TORs per pod when they pair up (64 nodes: 4 pods × 2
    /// TORs × 8 nodes; 16: 2 × 2 × 4; 8: 2 × 2 × 2), or `pods` pods split the same way.
    ///
    /// # Errors
    /// When the nodes do not fit (more than a switch's 16 children on one TOR, nodes that
    /// do not split evenly into the pods, a shape [`Shape::check`] refuses).
    pub fn shape(&self, nodes: usize) -> Result<Shape, String> {
        let shape = match self.levels {
            1 if nodes > MAX_CHILDREN => {
                return Err(format!(
                    "{nodes} nodes on one TOR: a switch takes at most {MAX_CHILDREN} children"
                ));
            }
            1 => Shape::one_level(nodes).with_sockets(2),
            2 => shape_for(nodes),
            3 => {
                let (pods, per_pod) = match self.pods {
                    Some(p) if p > 0 && nodes.is_multiple_of(p) => (Some(p), nodes / p),
                    Some(p) => return Err(format!("{nodes} nodes do not split into {p} pods")),
                    None => (None, nodes),
                };
                // Nodes per TOR: the largest divisor up to 8 and up to a quarter of the
                // nodes (a pod's when the pods are given, so each has 2 TORs if it can).
                let cap = (per_pod / if pods.is_some() { 2 } else { 4 }).clamp(1, 8);
                let hosts = (1..=cap)
                    .rev()
                    .find(|h| per_pod.is_multiple_of(*h))
                    .unwrap_or(1);
                let tors = nodes / hosts;
                let pods = pods.unwrap_or(if tors >= 4 && tors.is_multiple_of(2) {
                    tors / 2
                } else {
                    tors
                });
                Shape::three_level(pods, tors / pods, hosts, self.aggs, self.cores).with_sockets(2)
            }
            l => return Err(format!("--levels {l}: the lab builds 1, 2 or 3 levels")),
        };
        shape.check()?;
        Ok(shape)
    }
}

/// Sets every link of `topo` to drop `rate` of the INC data packets it carries, each way.
fn lose_on_every_link(topo: &Topology, rate: f64) {
    let wires = topo.wires.as_ref().expect("a wired fabric");
    let faults = Faults {
        kinds: KIND_CONTRIBUTION | KIND_RESULT,
        drop: rate,
        ..Faults::default()
    };
    for link in wires.links().collect::<Vec<_>>() {
        for dir in [Dir::Up, Dir::Down] {
            wires.set(link, dir, faults);
        }
    }
}

/// One rank's measurements at one size.
#[derive(Default)]
struct RankSamples {
    /// Microseconds per timed iteration.
    samples: Vec<f32>,
    errors: usize,
    fallbacks: usize,
    retransmissions: u64,
    path: Option<Path>,
    /// The error that ended this rank's case (its later sizes are skipped).
    failed: Option<String>,
    /// Rank 0's profile of the case, when the sweep profiles.
    cpu: Option<CpuCost>,
    /// On a shaped fabric, rank 0's reading of the busiest link over the same window.
    link: Option<LinkUse>,
}

impl RankSamples {
    fn failed(why: String) -> Self {
        Self {
            failed: Some(why),
            ..Self::default()
        }
    }
}

/// Diagnostics (`INNET_BENCH_FALLBACKS`): every switch's counters and groups, two hosts'
/// UDP counters, the kernel's neighbour-table counters and the switch daemons' logs, on
/// stderr (each fallback is printed with its reason as it happens).
fn dump_state(topo: &Topology, daemons: &[innet_lab::daemons::DaemonGuard]) {
    let innet = innet_lab::innet_bin();
    for sw in topo.switches() {
        for args in [&["stats", "-e"][..], &["group", "list"][..]] {
            let out = sw
                .ns
                .command(innet.to_str().expect("utf-8"))
                .args(args)
                .arg("--pin-path")
                .arg(sw.pins.layout.root())
                .output();
            let text = out.map_or_else(
                |e| e.to_string(),
                |o| {
                    String::from_utf8_lossy(&o.stdout).into_owned()
                        + &String::from_utf8_lossy(&o.stderr)
                },
            );
            eprintln!("=== switch {} innet {args:?}\n{text}", sw.ip);
        }
    }
    for h in topo.hosts.iter().take(2) {
        let out = h.ns.command("cat").arg("/proc/net/snmp").output();
        let text = out.map_or_else(
            |e| e.to_string(),
            |o| String::from_utf8_lossy(&o.stdout).into_owned(),
        );
        eprintln!("=== host {} /proc/net/snmp\n{text}", h.ip);
    }
    // One neighbour table for all namespaces: `table_fulls` counts refused entries.
    let arp = std::fs::read_to_string("/proc/net/stat/arp_cache").unwrap_or_default();
    eprintln!("=== /proc/net/stat/arp_cache (hex, per CPU)\n{arp}");
    for d in daemons {
        let log = std::fs::read_to_string(&d.1).unwrap_or_default();
        eprintln!("=== daemon log {}\n{log}", d.1.display());
    }
}

/// Runs the sweep; each finished (job, size) becomes a row and a progress step.
#[must_use]
pub fn run(sweep: &Sweep, progress: &ProgressBar) -> Vec<LatencyRow> {
    run_on_fabrics(sweep, progress, false).0
}

/// [`run`], and on each node count's shaped fabric, before its runs, TCP across it both
/// ways (iperf3, 3 s a direction: [`innet_lab::link_checks::check_links`]): the links'
/// rate as a flow sees it on the very fabric the runs measure.
///
/// # Panics
/// The sweep's links are not shaped.
#[must_use]
pub fn run_checking_links(
    sweep: &Sweep,
    progress: &ProgressBar,
) -> (Vec<LatencyRow>, Vec<super::LinkChecks>) {
    assert!(sweep.link_rate.is_some(), "no link rate to check");
    run_on_fabrics(sweep, progress, true)
}

fn run_on_fabrics(
    sweep: &Sweep,
    progress: &ProgressBar,
    check_links: bool,
) -> (Vec<LatencyRow>, Vec<super::LinkChecks>) {
    let (mut rows, mut checks) = (vec![], vec![]);
    for &nodes in &sweep.nodes {
        progress.set_message(format!(
            "building the {nodes}-node fabric, starting daemons"
        ));
        let dpus = sweep.modes.contains(&Mode::IncDpu);
        let options = Options {
            innet: true,
            mtu: sweep.mtu,
            window: sweep.window,
            dpus,
            link_rate: sweep.link_rate,
            wires: sweep.link_loss.is_some(),
        };
        let shape = sweep
            .fabric
            .shape(nodes)
            .unwrap_or_else(|e| panic!("{e}"))
            .with_mode(sweep.switch_mode);
        let topo = Topology::with(shape, options);
        if let Some(rate) = sweep.link_loss {
            lose_on_every_link(&topo, rate);
        }
        learn_hosts(&topo);
        if let Some(rate) = sweep.link_rate.filter(|_| check_links) {
            progress.set_message(format!("{nodes} nodes: the links checked with TCP"));
            checks.push(super::LinkChecks {
                nodes,
                levels: topo.shape.levels,
                rate_bps: rate.0,
                checks: innet_lab::link_checks::check_links(&topo, 3),
            });
        }
        let switch_daemons = daemons_on(&topo, &[]);
        let _nic_daemons = sweep
            .modes
            .contains(&Mode::IncNic)
            .then(|| with_window(sweep.window, |extra| nic_daemons_on(&topo, extra)));
        let _dpu_daemons =
            dpus.then(|| with_window(sweep.window, |extra| dpu_daemons_on(&topo, extra)));
        for (n, ppn, mode) in sweep.jobs().into_iter().filter(|j| j.0 == nodes) {
            progress.set_message(format!("{n} nodes × {ppn} ppn, {mode}"));
            rows.extend(run_one(&topo, sweep, ppn, mode, progress));
        }
        if std::env::var_os("INNET_BENCH_FALLBACKS").is_some() {
            dump_state(&topo, &switch_daemons);
        }
    }
    (rows, checks)
}

fn run_one(
    topo: &Topology,
    sweep: &Sweep,
    ppn: usize,
    mode: Mode,
    progress: &ProgressBar,
) -> Vec<LatencyRow> {
    let nodes = topo.shape.tors * topo.shape.hosts_per_tor;
    let sockets = if ppn.is_multiple_of(2) { 2 } else { 1 };
    let layout = Layout::new(nodes * ppn, ppn, sockets).expect("bench layout");
    let answers: Vec<Vec<Vec<u8>>> = sweep
        .sizes
        .iter()
        .map(|&bytes| {
            (0..CASES)
                .map(|c| {
                    let count = elements(bytes, sweep.op, sweep.dtype);
                    expected(layout.size, c, sweep.op, sweep.dtype, count)
                })
                .collect()
        })
        .collect();
    // Long messages on the hosts take seconds here (every rank shares 2 CPUs): give them
    // room rather than count them as hangs.
    let long = sweep.sizes.iter().any(|&b| b > 1 << 20);
    let links = topo.wires.as_ref().and_then(|w| Some((&w.ns, w.rate?)));
    let per_rank = run_job(
        topo,
        layout,
        mode,
        |cfg| {
            if long {
                cfg.timeout = Duration::from_mins(2);
            }
            if let Some(spin) = sweep.spin {
                cfg.spin = spin;
            }
        },
        |comm| {
            let mut failed: Option<String> = None;
            sweep
                .sizes
                .iter()
                .zip(&answers)
                .map(|(&bytes, answers)| {
                    // After an error the ranks no longer call the same collectives.
                    let s = if let Some(e) = &failed {
                        RankSamples::failed(format!("skipped after: {e}"))
                    } else {
                        measure(
                            comm,
                            (sweep.op, sweep.dtype),
                            bytes,
                            iterations_for(bytes, sweep.iterations),
                            answers,
                            (sweep.profile, links),
                        )
                    };
                    failed.clone_from(&s.failed);
                    if comm.rank() == 0 {
                        progress.inc(1);
                    }
                    s
                })
                .collect::<Vec<_>>()
        },
    );
    sweep
        .sizes
        .iter()
        .enumerate()
        .map(|(s, &bytes)| {
            let mut all: Vec<f32> = per_rank
                .iter()
                .flat_map(|r| r[s].samples.iter().copied())
                .collect();
            let avg = all.iter().map(|&x| f64::from(x)).sum::<f64>() / all.len().max(1) as f64;
            all.sort_by(f32::total_cmp);
            LatencyRow {
                mode: mode.name().into(),
                path: per_rank[0][s].path.map_or("-", path_name).into(),
                dtype: sweep.dtype.name().into(),
                nodes,
                ppn,
                ranks: layout.size,
                bytes,
                iterations: per_rank[0][s].samples.len(),
                avg_us: avg,
                p50_us: percentile(&all, 50.0),
                p99_us: percentile(&all, 99.0),
                errors: per_rank.iter().map(|r| r[s].errors).sum(),
                fallbacks: per_rank.iter().map(|r| r[s].fallbacks).sum(),
                retransmissions: per_rank.iter().map(|r| r[s].retransmissions).sum(),
                failed: per_rank.iter().find_map(|r| r[s].failed.clone()),
                mtu: sweep.mtu.unwrap_or(STANDARD_MTU),
                link_bps: sweep.link_rate.map(|r| r.0),
                link_loss: sweep.link_loss,
                window: sweep.window,
                levels: topo.shape.levels,
                cpu: per_rank[0][s].cpu.clone(),
                link_use: per_rank[0][s].link.as_ref().map(|l| l.share),
                link_drops: per_rank[0][s].link.as_ref().map(|l| l.drops),
            }
        })
        .collect()
}

/// The cutover rules for the library's `auto` mode: per shape, the sizes up to which the
/// network mode `auto` picks (inc-socket where it runs, else inc-node) beat the better host
/// algorithm, measured in the same run.
#[must_use]
pub fn cutover_rules(rows: &[LatencyRow]) -> Vec<Cutover> {
    let avg = |mode: &str, r: &LatencyRow| {
        rows.iter()
            .find(|x| {
                x.mode == mode
                    && x.errors == 0
                    && x.failed.is_none()
                    && (x.nodes, x.ppn, x.bytes) == (r.nodes, r.ppn, r.bytes)
            })
            .map(|x| x.avg_us)
    };
    let points: Vec<Measured> = rows
        .iter()
        .filter(|r| r.mode == Mode::HostRd.name())
        .filter_map(|r| {
            let network =
                avg(Mode::IncSocket.name(), r).or_else(|| avg(Mode::IncNode.name(), r))?;
            let host = [Mode::HostRd, Mode::HostRing]
                .iter()
                .filter_map(|m| avg(m.name(), r))
                .fold(f64::INFINITY, f64::min);
            Some(Measured {
                nodes: r.nodes,
                ppn: r.ppn,
                bytes: r.bytes,
                network_us: network,
                host_us: host,
            })
        })
        .collect();
    cutover::derive(&points)
}

/// Elements in `bytes` (at least one).
fn elements(bytes: usize, op: Op, dtype: Dtype) -> usize {
    (bytes / element_bytes(op, dtype)).max(1)
}

/// A warm-up of a tenth of the iterations (5 to 500), then `iterations` timed allreduces,
/// each checked against the reference. With `profile`, rank 0 reads the machine's counters
/// before the last warm-up call (which the other ranks then wait out, so the reading does
/// not land in their timed calls) and after the last timed one.
fn measure(
    comm: &mut Communicator,
    (op, dtype): (Op, Dtype),
    bytes: usize,
    iterations: usize,
    answers: &[Vec<u8>],
    (profile, links): (bool, Option<(&NetNs, LinkRate)>),
) -> RankSamples {
    let count = elements(bytes, op, dtype);
    let inputs: Vec<Vec<u8>> = (0..CASES)
        .map(|c| input(comm.rank(), c, op, dtype, count))
        .collect();
    let mut recv = vec![0u8; count * element_bytes(op, dtype)];
    let warmup = (iterations / 10).clamp(5, 500);
    let mut out = RankSamples {
        samples: Vec::with_capacity(iterations),
        ..RankSamples::default()
    };
    let mut before = None;
    let mut meter = None;
    for i in 0..warmup + iterations {
        if comm.rank() == 0 && i + 1 == warmup {
            before = profile.then(|| Snapshot::take(true));
            meter = links.map(|(wires, rate)| (LinkMeter::start(wires), rate));
        }
        let start = Instant::now();
        let report = match comm.allreduce_bytes(&inputs[i % CASES], &mut recv, op, dtype) {
            Ok(r) => r,
            Err(e) => {
                out.failed = Some(format!("rank {}: {bytes} B: {e}", comm.rank()));
                return out;
            }
        };
        let took = start.elapsed();
        if recv != answers[i % CASES] {
            out.errors += 1;
            // A wrong result must never happen: say enough to find its cause from a CI log.
            eprintln!(
                "{}",
                describe_wrong(comm.rank(), bytes, i, warmup, &recv, answers, &report)
            );
        }
        out.fallbacks += usize::from(report.fallback.is_some());
        if let Some(why) = report.fallback
            && std::env::var_os("INNET_BENCH_FALLBACKS").is_some()
        {
            eprintln!(
                "fallback: rank {} {bytes} B call {i} ({}) {why:?} after {} µs, regrouped {:?}",
                comm.rank(),
                if i < warmup { "warm-up" } else { "timed" },
                took.as_micros(),
                report.regrouped,
            );
        }
        out.path = Some(report.path);
        if i >= warmup {
            out.samples.push(took.as_secs_f32() * 1e6);
            out.retransmissions += u64::from(report.retransmissions);
        }
    }
    out.cpu = before.and_then(|b| b.cost(iterations + 1));
    out.link = meter.and_then(|(m, rate)| m.busiest(rate));
    out
}

/// One line about a wrong result: where it happened, the first bytes that differ, and
/// whether it is another case's answer (a stale or misrouted result rather than a bad sum).
fn describe_wrong(
    rank: usize,
    bytes: usize,
    call: usize,
    warmup: usize,
    got: &[u8],
    answers: &[Vec<u8>],
    report: &Report,
) -> String {
    let want = &answers[call % CASES];
    let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
    let end = (first + 8).min(got.len());
    let other = answers.iter().position(|a| a.as_slice() == got);
    format!(
        "WRONG RESULT: rank {rank} {bytes} B call {call} ({}): bytes {first}..{end} are {:02x?}, \
         expected {:02x?}; equals case {other:?}'s answer (this call's case is {}); \
         path {:?}, fallback {:?}, regrouped {:?}, retransmissions {}",
        if call < warmup { "warm-up" } else { "timed" },
        &got[first..end],
        &want[first..end.min(want.len())],
        call % CASES,
        report.path,
        report.fallback,
        report.regrouped,
        report.retransmissions,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_mode_needs_an_even_split() {
        assert!(!runs(Mode::IncSocket, 1));
        assert!(runs(Mode::IncSocket, 2));
        assert!(!runs(Mode::IncSocket, 3));
        assert!(runs(Mode::HostRd, 1));
        let sweep = Sweep {
            nodes: vec![4, 16],
            ppn: vec![1, 2],
            sizes: vec![4, 256],
            modes: vec![Mode::HostRd, Mode::IncSocket],
            iterations: 10,
            op: Op::Sum,
            dtype: Dtype::I32,
            spin: None,
            mtu: None,
            link_rate: None,
            link_loss: None,
            window: None,
            switch_mode: XdpMode::Native,
            fabric: Depth::default(),
            profile: false,
        };
        // 2 node counts × (1 ppn: host-rd; 2 ppn: both) = 6 jobs, 2 sizes each.
        assert_eq!(sweep.jobs().len(), 6);
        assert_eq!(sweep.steps(), 12);
    }

    #[test]
    fn fewer_iterations_for_long_messages() {
        assert_eq!(iterations_for(256, 10_000), 10_000);
        assert_eq!(iterations_for(4096, 10_000), 2_000);
        assert_eq!(iterations_for(65_536, 10_000), 200);
        assert_eq!(iterations_for(65_536, 20), 5);
    }

    #[test]
    fn shapes_hold_the_nodes() {
        for n in [2, 4, 9, 16, 5] {
            let s = shape_for(n);
            assert_eq!(s.tors * s.hosts_per_tor, n);
        }
        assert_eq!(shape_for(9).spines, 2);
    }

    #[test]
    fn fabrics_of_every_depth_hold_the_nodes() {
        let at = |levels| Depth {
            levels,
            ..Depth::default()
        };
        assert_eq!(at(1).shape(8).expect("1 level").tors, 1);
        assert!(at(1).shape(32).is_err());
        assert_eq!(at(2).shape(16).expect("2 levels"), shape_for(16));
        for (n, (pods, tors, hosts)) in [(64, (4, 8, 8)), (16, (2, 4, 4)), (8, (2, 4, 2))] {
            let s = at(3).shape(n).expect("3 levels");
            assert_eq!(
                (s.pods, s.tors, s.hosts_per_tor),
                (pods, tors, hosts),
                "{n}"
            );
            assert_eq!((s.aggs, s.spines, s.nodes()), (2, 2, n));
        }
        let s = Depth {
            pods: Some(2),
            ..at(3)
        }
        .shape(16)
        .expect("2 pods");
        assert_eq!((s.pods, s.tors, s.hosts_per_tor), (2, 4, 4));
        assert!(
            Depth {
                pods: Some(3),
                ..at(3)
            }
            .shape(16)
            .is_err()
        );
        assert!(at(4).shape(8).is_err());
    }
}
