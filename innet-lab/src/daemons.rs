//! `innet daemon` processes on the switches of a [`Topology`]: started in the switch's
//! namespace, logging to a file (a pipe nobody reads fills up and blocks the daemon), and
//! killed when the guard drops or when this process ends, however it ends; a failing test
//! prints the log's tail.

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use aya::maps::{Array, MapData};
use innet_common::{
    codec::{Addressing, encode_control, read},
    control::SwitchConfig,
    maps::SWITCH_CONFIG,
    proto::PacketKind,
    wire::{BTH_LEN, ControlPayload, DETH_LEN, ETH_LEN, INC_LEN, IPV4_LEN, IncHeader, UDP_LEN},
};

use crate::{
    NetNs, PinRoot, innet_bin,
    topology::{DPU_HOST_PORT, DPU_UPLINK, Host, Switch, Topology},
};

/// Whether the switch's daemon has taken over control packets.
#[must_use]
pub fn control_enabled(sw: &Switch) -> bool {
    control_taken(&sw.pins)
}

/// Whether the daemon of the programs pinned at `pins` has taken over control packets.
fn control_taken(pins: &PinRoot) -> bool {
    let Ok(map) = pins.layout.open_map(SWITCH_CONFIG) else {
        return false;
    };
    let cfg: Array<MapData, SwitchConfig> = map.try_into().expect("array");
    cfg.get(&0, 0).is_ok_and(|c| c.control_to_daemon == 1)
}

/// The set-up key of the lab's hand-driven handshakes ([`leader`]'s): one for every group.
pub const LAB_SETUP_KEY: u64 = 0x1ab0_5e70_9ce4;

/// Set (to anything): the daemons' logs stay in the temporary directory, each named on
/// standard error, for a look after a run that went wrong.
pub const KEEP_LOGS_VAR: &str = "INNET_LAB_KEEP_LOGS";

/// Kills the daemon if the test fails before it stopped it. The daemon logs to a file: a
/// pipe nobody reads fills up and blocks the daemon.
pub struct DaemonGuard(pub Child, pub std::path::PathBuf);
impl Drop for DaemonGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let log = std::fs::read_to_string(&self.1).unwrap_or_default();
        if std::env::var_os(KEEP_LOGS_VAR).is_some() {
            eprintln!("daemon log kept: {}", self.1.display());
        } else {
            let _ = std::fs::remove_file(&self.1);
        }
        // A failing test shows what the daemon said.
        if std::thread::panicking() {
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("--- daemon log (last 40 lines) ---");
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
    }
}

#[must_use]
pub fn spawn_daemon(sw: &Switch, role: &str) -> DaemonGuard {
    spawn_daemon_with(sw, role, &[])
}

#[must_use]
pub fn spawn_daemon_with(sw: &Switch, role: &str, extra: &[&str]) -> DaemonGuard {
    let mut cmd = sw.ns.command(innet_bin().to_str().expect("utf-8"));
    cmd.args([
        "daemon",
        "--role",
        role,
        "--ip",
        &sw.ip.to_string(),
        "--pin-path",
    ])
    .arg(sw.pins.path());
    for p in &sw.ports {
        cmd.args(["--iface", p]);
    }
    // Every port towards a parent: a TOR's, and a middle level's (an aggregation switch
    // runs `--role spine` with uplinks to the cores).
    for up in &sw.uplinks {
        cmd.args(["--uplink", &up.name]);
    }
    cmd.args(extra).env(
        "RUST_LOG",
        std::env::var("DAEMON_LOG").unwrap_or_else(|_| "info".into()),
    );
    let mut d = spawn_logged(cmd);
    let start = Instant::now();
    while !control_enabled(sw) {
        if let Some(status) = d.0.try_wait().expect("try_wait") {
            let err = std::fs::read_to_string(&d.1).unwrap_or_default();
            panic!("the daemon exited ({status}):\n{err}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the daemon did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    d
}

/// Starts a daemon whose log goes to a temporary file; it dies with this process
/// ([`spawn_tied`](crate::spawn_tied)).
#[must_use]
pub fn spawn_logged(mut cmd: std::process::Command) -> DaemonGuard {
    let log = std::env::temp_dir().join(format!("innet-daemon-{}.log", crate::unique_id()));
    let file = std::fs::File::create(&log).expect("daemon log file");
    cmd.stdout(Stdio::null()).stderr(file);
    // Tied: a daemon must not outlive the lab process, nor die with a short-lived thread.
    let child = crate::spawn_tied(cmd).expect("spawn the daemon");
    DaemonGuard(child, log)
}

/// A daemon on every switch of the fabric, every level: TORs (`--role tor`) with their
/// uplinks, aggregation switches (`--role spine`) with their uplinks to the cores, SPINEs
/// and cores (`--role spine`).
#[must_use]
pub fn daemons_on(topo: &Topology, extra: &[&str]) -> Vec<DaemonGuard> {
    topo.switches()
        .map(|sw| spawn_daemon_with(sw, if sw.level == 1 { "tor" } else { "spine" }, extra))
        .collect()
}

/// Runs `f` with the daemon arguments that set the maps' window (`--window W`, or none
/// for the default).
pub fn with_window<R>(window: Option<u32>, f: impl FnOnce(&[&str]) -> R) -> R {
    let w = window.map(|w| w.to_string());
    match w.as_deref() {
        Some(w) => f(&["--window", w]),
        None => f(&[]),
    }
}

/// `innet daemon --role nic` on each node's first port (the NIC its leader uses), ready to
/// take clients when this returns.
#[must_use]
pub fn nic_daemons_on(topo: &Topology, extra: &[&str]) -> Vec<DaemonGuard> {
    let hosts: Vec<_> = topo.hosts.iter().filter(|h| h.socket == 0).collect();
    let mut daemons: Vec<DaemonGuard> = hosts
        .iter()
        .map(|h| {
            spawn_logged(daemon_command(
                &h.ns,
                &h.pins,
                &["--role", "nic", "--iface", "eth0"],
                extra,
            ))
        })
        .collect();
    wait_started(&hosts, &mut daemons, "NIC", |h| {
        h.ns.run(nic_daemon_listens)
    });
    daemons
}

/// `innet daemon ARGS… --pin-path PINS EXTRA…` in `ns`, logging at `$DAEMON_LOG` (info).
fn daemon_command(ns: &NetNs, pins: &PinRoot, args: &[&str], extra: &[&str]) -> Command {
    let mut cmd = ns.command(innet_bin().to_str().expect("utf-8"));
    cmd.arg("daemon")
        .args(args)
        .arg("--pin-path")
        .arg(pins.path())
        .args(extra)
        .env(
            "RUST_LOG",
            std::env::var("DAEMON_LOG").unwrap_or_else(|_| "info".into()),
        );
    cmd
}

/// Waits until each host's daemon (`what`: NIC or DPU) is `ready`; panics with its log when
/// one exits, or after 3 minutes.
fn wait_started(
    hosts: &[&Host],
    daemons: &mut [DaemonGuard],
    what: &str,
    ready: impl Fn(&Host) -> bool,
) {
    let start = Instant::now();
    for (h, d) in hosts.iter().zip(daemons) {
        while !ready(h) {
            if let Some(status) = d.0.try_wait().expect("try_wait") {
                let err = std::fs::read_to_string(&d.1).unwrap_or_default();
                panic!("the {what} daemon of {} exited ({status}):\n{err}", h.ip);
            }
            assert!(
                start.elapsed() < Duration::from_mins(3),
                "the {what} daemon of {} did not start",
                h.ip
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The small shape's fabric of plain bridges whose nodes have DPUs, the hosts known to their
/// TORs, and `innet daemon --role dpu` on each DPU.
#[must_use]
pub fn dpu_fabric() -> (Topology, Vec<DaemonGuard>) {
    let topo = Topology::with(
        crate::topology::Shape::small(),
        crate::topology::Options {
            dpus: true,
            ..crate::topology::Options::default()
        },
    );
    learn_hosts(&topo);
    let daemons = dpu_daemons_on(&topo, &[]);
    (topo, daemons)
}

/// `innet daemon --role dpu` on the DPU of each node's first port (fabrics with
/// [`Options::dpus`]; the NIC its leader uses), ready to take its host's requests when
/// this returns.
///
/// [`Options::dpus`]: crate::topology::Options::dpus
#[must_use]
pub fn dpu_daemons_on(topo: &Topology, extra: &[&str]) -> Vec<DaemonGuard> {
    let hosts: Vec<_> = topo.hosts.iter().filter(|h| h.socket == 0).collect();
    // Started together: each spends seconds loading the object.
    let mut daemons: Vec<DaemonGuard> = hosts
        .iter()
        .map(|h| {
            let dpu = h.dpu.as_ref().expect("a fabric with DPUs");
            let ip = dpu.ip.to_string();
            let role = [
                "--role",
                "dpu",
                "--iface",
                DPU_HOST_PORT,
                "--iface",
                DPU_UPLINK,
            ];
            let args = [&role[..], &["--uplink", DPU_UPLINK, "--ip", &ip]].concat();
            spawn_logged(daemon_command(&dpu.ns, &dpu.pins, &args, extra))
        })
        .collect();
    wait_started(&hosts, &mut daemons, "DPU", |h| {
        h.dpu.as_ref().is_some_and(|d| control_taken(&d.pins))
    });
    daemons
}

/// Whether a NIC daemon takes clients in the current network namespace.
fn nic_daemon_listens() -> bool {
    innet_net::nic::ipc::address()
        .and_then(|a| std::os::unix::net::UnixStream::connect_addr(&a))
        .is_ok()
}

/// Lets every bridge learn every host (ping is ordinary traffic the bridges forward), after
/// making room for the fabric in the kernel's neighbour table ([`room_for_neighbours`]). A
/// ping may fail while many namespaces resolve neighbours at once (`sendmsg: No buffer
/// space available`), so each host gets three tries before the fabric counts as broken.
pub fn learn_hosts(topo: &Topology) {
    let dpus = topo.hosts.iter().filter(|h| h.dpu.is_some()).count();
    room_for_neighbours(topo.hosts.len() + dpus + topo.switches().count());
    for h in &topo.hosts[1..] {
        let ip = h.ip.to_string();
        let ping = || {
            let mut cmd = topo.hosts[0].ns.command("ping");
            cmd.args(["-c", "1", "-W", "2", &ip]);
            cmd
        };
        let answered = (0..2).any(|_| ping().output().is_ok_and(|o| o.status.success()));
        if !answered {
            crate::run(&mut ping());
        }
    }
}

/// The kernel's IPv4 neighbour (ARP) table is one table for every network namespace, and
/// holds at most `gc_thresh3` entries (1024 by default); past `gc_thresh2` (512) it evicts
/// only entries idle for 5 s. A fabric of `addresses` namespaces on one machine needs up to
/// `addresses²` entries: each host resolves its ring successor, its host-algorithm peers
/// and its TOR in its own namespace. With too few, a new entry is refused (`neighbour:
/// arp_cache: neighbor table overflow!`, `table_fulls` in /proc/net/stat/arp_cache) and the
/// packet that needed it is dropped: at 64 nodes (4,096 pairs) whole leaders' data packets
/// never left their hosts and every in-network collective timed out (docs/bench/large-64).
/// Raises both limits (never lowers them: other fabrics may be running) to twice that
/// square plus 1024, from the initial namespace; a failure is reported, not fatal.
pub fn room_for_neighbours(addresses: usize) {
    let want = 2 * addresses * addresses + 1024;
    for (name, at_least) in [("gc_thresh3", want), ("gc_thresh2", want / 2)] {
        let path = format!("/proc/sys/net/ipv4/neigh/default/{name}");
        let now: usize = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        if now >= at_least {
            continue;
        }
        if let Err(e) = std::fs::write(&path, at_least.to_string()) {
            eprintln!(
                "warning: cannot raise {path} from {now} to {at_least} for {addresses} namespaces ({e}): collectives may time out on a full neighbour table"
            );
        }
    }
}

/// The UDP payload of a control packet (the kernel adds the rest).
#[must_use]
pub fn control(kind: PacketKind, c: &ControlPayload, rank: u32) -> Vec<u8> {
    encode_control(&Addressing::default(), kind, rank, c)[ETH_LEN + IPV4_LEN + UDP_LEN..].to_vec()
}

/// Group `id` as installed on `sw`, if it is.
#[must_use]
pub fn installed(sw: &Switch, id: u32) -> Option<innet::group_maps::GroupInfo> {
    innet::group_maps::GroupMaps::open(&sw.pins.layout)
        .ok()?
        .get(id)
        .ok()
}

/// The next control packet of `kind` for group `comm`; anything else queued (a previous
/// group's kill, say) is skipped.
#[must_use]
pub fn recv_control(sock: &std::net::UdpSocket, kind: PacketKind, comm: u32) -> ControlPayload {
    let mut buf = [0u8; 512];
    loop {
        let (n, _) = sock
            .recv_from(&mut buf)
            .unwrap_or_else(|e| panic!("waiting for a {kind:?} of {comm:#x}: {e}"));
        let data_flag = buf[BTH_LEN + DETH_LEN + 8];
        let c: ControlPayload = read(&buf[BTH_LEN + DETH_LEN + INC_LEN..n]);
        if data_flag == kind as u8 && c.true_comm_id() == comm {
            return c;
        }
    }
}

/// Polls `done` every 100 ms; panics naming `what` after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < timeout, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Resident memory of process `pid` in KiB (`None` if it is gone).
#[must_use]
pub fn rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// `count` allreduce rounds (SUM of u32) of group `wire` among the hosts `members` (host
/// indices; each sends its contribution towards the next member), checked on every member.
///
/// # Panics
/// A member gets no result, or a wrong one.
pub fn rounds(
    topo: &Topology,
    socks: &[std::net::UdpSocket],
    members: &[usize],
    wire: u32,
    (first, count): (u8, u8),
) {
    use innet_common::{
        proto::{Dtype, Op},
        reduce::reduce_all,
    };
    let mut buf = [0u8; 512];
    for r in first..first + count {
        let bodies: Vec<Vec<u8>> = members.iter().map(|&h| vec![r ^ h as u8; 16]).collect();
        let expected = reduce_all(Op::Sum, Dtype::U32, &bodies).expect("reference");
        for (i, &h) in members.iter().enumerate() {
            let next = topo.hosts[members[(i + 1) % members.len()]].ip;
            let body = crate::topology::contribution(
                wire,
                i as u32,
                r.into(),
                Op::Sum,
                Dtype::U32,
                &bodies[i],
            );
            socks[h].send_to(&body, (next, 4791)).expect("send");
        }
        for &h in members {
            // Late copies of the set-up's control packets may still be queued: not results.
            let (n, from) = loop {
                let (n, from) = socks[h]
                    .recv_from(&mut buf)
                    .unwrap_or_else(|e| panic!("host {h}, round {r}: {e}"));
                let comm_id = BTH_LEN + DETH_LEN + core::mem::offset_of!(IncHeader, comm_id);
                if buf.get(comm_id) != Some(&innet_common::proto::CONTROL_COMM_ID) {
                    break (n, from);
                }
            };
            assert_eq!(
                crate::topology::body_of(&buf[..n], 16),
                &expected[..],
                "host {h}, round {r}: from {from}, {n} bytes"
            );
        }
    }
}

/// Host `h`'s end of the library's handshake on its INC socket `socks[h]` (rank `h`,
/// 5 s timeout, 100 ms first retry, the 1500 B MTU's payload, [`LAB_SETUP_KEY`]).
#[must_use]
pub fn leader<'a>(
    topo: &Topology,
    socks: &'a [std::net::UdpSocket],
    h: usize,
) -> innet_client::handshake::Leader<'a> {
    innet_client::handshake::Leader {
        sock: &socks[h],
        ip: topo.hosts[h].ip,
        rank: h as u32,
        timeout: Duration::from_secs(5),
        retry: Duration::from_millis(100),
        offer: None,
        payload: innet_common::proto::DEFAULT_PAYLOAD_BYTES as u16,
        aside: None,
        key: LAB_SETUP_KEY,
    }
}
