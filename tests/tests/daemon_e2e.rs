//! `innet daemon` on a TOR: it recovers the pinned programs, takes control packets from
//! XDP, fills in the query on its way to the MRR and re-sends it along the bridge's path;
//! SIGTERM gives control packets back to the fabric and removes every pin.

use std::{
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use aya::maps::{Array, MapData};
use innet::{loader::Mode, stats};
use innet_common::{
    codec::{Addressing, encode_control, read},
    control::SwitchConfig,
    maps::SWITCH_CONFIG,
    proto::{PacketKind, QNH_HOPS_MASK},
    wire::{BTH_LEN, ControlPayload, DETH_LEN, ETH_LEN, INC_LEN, IPV4_LEN, UDP_LEN},
};
use innet_tests::{
    innet_bin,
    topology::{Shape, Switch, Topology},
};

fn control_enabled(sw: &Switch) -> bool {
    let Ok(map) = sw.pins.layout.open_map(SWITCH_CONFIG) else {
        return false;
    };
    let cfg: Array<MapData, SwitchConfig> = map.try_into().expect("array");
    cfg.get(&0, 0).is_ok_and(|c| c.control_to_daemon == 1)
}

/// Kills the daemon if the test fails before it stopped it.
struct DaemonGuard(Child);
impl Drop for DaemonGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn query() -> Vec<u8> {
    let mut p = ControlPayload::default();
    p.set_sup_allreduce_op(0xffff);
    p.set_sup_data_type(0xffff);
    p.set_sup_max_data_size(4096);
    p.set_true_comm_id(0x00c0_de01);
    let frame = encode_control(&Addressing::default(), PacketKind::Query, 1, &p);
    frame[ETH_LEN + IPV4_LEN + UDP_LEN..].to_vec()
}

fn received(buf: &[u8]) -> ControlPayload {
    read(&buf[BTH_LEN + DETH_LEN + INC_LEN..])
}

#[test]
fn daemon_fills_in_queries_forwards_them_and_cleans_up() {
    let topo = Topology::new(Shape {
        tors: 1,
        hosts_per_tor: 2,
        spines: 0,
        mode: Mode::Native,
    });
    let tor = &topo.tors[0];
    let socks = topo.sockets();
    let (nmrr, mrr) = (&topo.hosts[0], &topo.hosts[1]);

    let mut cmd = tor.ns.command(innet_bin().to_str().expect("utf-8"));
    cmd.args([
        "daemon",
        "--role",
        "tor",
        "--ip",
        &tor.ip.to_string(),
        "--pin-path",
    ])
    .arg(tor.pins.path());
    for p in &tor.ports {
        cmd.args(["--iface", p]);
    }
    cmd.env("RUST_LOG", "debug");
    let mut daemon = DaemonGuard(
        cmd.stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the daemon"),
    );
    let start = Instant::now();
    while !control_enabled(tor) {
        if let Some(status) = daemon.0.try_wait().expect("try_wait") {
            let mut err = String::new();
            let _ =
                std::io::Read::read_to_string(daemon.0.stderr.as_mut().expect("piped"), &mut err);
            panic!("the daemon exited ({status}):\n{err}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the daemon did not take over control packets"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // The NMRR's query crosses the TOR: one hop, TOR address, capabilities intersected.
    socks[0].send_to(&query(), (mrr.ip, 4791)).expect("send");
    let mut buf = [0u8; 512];
    let (n, from) = match socks[1].recv_from(&mut buf) {
        Ok(r) => r,
        Err(e) => {
            let _ = daemon.0.kill();
            let mut err = String::new();
            let _ =
                std::io::Read::read_to_string(daemon.0.stderr.as_mut().expect("piped"), &mut err);
            let ports = stats::read(&tor.pins.layout)
                .map(|p| p.iter().map(|p| p.total).collect::<Vec<_>>());
            panic!("the query did not reach the MRR ({e}); ports: {ports:?}\ndaemon log:\n{err}");
        }
    };
    assert_eq!(from.ip(), nmrr.ip);
    let q = received(&buf[..n]);
    assert_eq!(q.query_notify_hop & QNH_HOPS_MASK, 1);
    assert_eq!(q.tor1_ip(), u32::from(tor.ip));
    assert_eq!(q.sup_allreduce_op(), 0x0fff, "every op");
    assert_eq!(q.sup_data_type(), 0x00ff, "integer types only, for now");
    assert_eq!(q.sup_max_data_size(), 1408);
    assert_eq!(q.true_comm_id(), 0x00c0_de01);
    let up: u64 = stats::read(&tor.pins.layout)
        .expect("stats")
        .iter()
        .map(|p| p.total.control_up)
        .sum();
    assert_eq!(up, 1);

    // SIGTERM: control packets pass again, programs and pins are gone.
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(daemon.0.id() as i32, libc::SIGTERM) };
    let status = daemon.0.wait().expect("wait");
    assert!(status.success(), "daemon exit: {status}");
    assert!(!tor.pins.path().exists(), "the daemon unpinned everything");
    socks[0].send_to(&query(), (mrr.ip, 4791)).expect("send");
    let (n, _) = socks[1]
        .recv_from(&mut buf)
        .expect("with no daemon, the query passes as is");
    assert_eq!(received(&buf[..n]).query_notify_hop, 0, "untouched");
}
