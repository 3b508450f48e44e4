//! The switch data plane end to end: hosts in namespaces send their contributions with a
//! plain UDP socket to their ring successor through TOR (and SPINE) bridge hosts running
//! innet, and each receives the reduced result, checked element by element against the
//! host reference. Counters on every switch must add up.

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream, UdpSocket},
};

use innet::{group_maps::GroupMaps, loader::XdpMode, stats};
use innet_common::{
    proto::{DEFAULT_PAYLOAD_BYTES, Dtype, Op, element_bytes},
    reduce::{reduce_all, same_result},
    stats::GroupStats,
};
use innet_lab::{
    Rng, run,
    topology::{Shape, Topology, body_of, contribution},
};

/// One allreduce round of group `id` over the hosts of `tors`: every host sends to its ring
/// successor under its TOR, every host must receive the reference result.
fn round(
    topo: &Topology,
    socks: &[UdpSocket],
    id: u32,
    tors: &[usize],
    r: u32,
    (op, dtype, count): (Op, Dtype, usize),
    rng: &mut Rng,
) {
    let members: Vec<usize> = tors
        .iter()
        .flat_map(|&t| topo.hosts_of(t).map(|(i, _)| i))
        .collect();
    let size = count * element_bytes(op, dtype);
    let bodies: Vec<Vec<u8>> = members.iter().map(|_| rng.bytes(size)).collect();
    // The reference folds in the tree's order (hosts under each TOR by rank, then the TORs
    // at the spine), the order the switches fix so that float sums come out reproducible.
    let mut rest = bodies.as_slice();
    let partials: Vec<Vec<u8>> = tors
        .iter()
        .map(|&t| {
            let (under_tor, after) = rest.split_at(topo.hosts_of(t).count());
            rest = after;
            reduce_all(op, dtype, under_tor).expect("TOR reference")
        })
        .collect();
    let expected = reduce_all(op, dtype, &partials).expect("reference");
    for (k, &i) in members.iter().enumerate() {
        let next = topo.next_under_tor(i);
        socks[i]
            .send_to(
                &contribution(id, i as u32, r, op, dtype, &bodies[k]),
                (next, 4791),
            )
            .expect("send");
    }
    let mut buf = [0u8; 2048];
    for &i in &members {
        let (n, _) = socks[i].recv_from(&mut buf).unwrap_or_else(|e| {
            panic!("host {i} got no result for {op:?} {dtype:?} round {r}: {e}")
        });
        let got = body_of(&buf[..n], size);
        assert!(
            same_result(op, dtype, got, &expected),
            "host {i}, {op:?} {dtype:?} ×{count} round {r}: got {got:02x?}, want {expected:02x?}"
        );
    }
}

fn group_stats(sw: &innet_lab::topology::Switch, id: u32) -> GroupStats {
    GroupMaps::open(&sw.pins.layout)
        .expect("maps")
        .get(id)
        .expect("group")
        .stats
}

/// Every frame a port saw got exactly one verdict.
fn assert_ports_balanced(sw: &innet_lab::topology::Switch) {
    for p in stats::read(&sw.pins.layout).expect("port stats") {
        let s = p.total;
        assert_eq!(
            s.rx_packets,
            s.xdp_pass + s.xdp_drop + s.xdp_tx + s.xdp_redirect + s.xdp_aborted,
            "port {}: {s:?}",
            p.ifindex
        );
        assert_eq!(s.xdp_aborted, 0, "port {}", p.ifindex);
    }
}

#[test]
fn one_tor_is_the_root() {
    let topo = Topology::new(Shape {
        tors: 1,
        hosts_per_tor: 4,
        sockets: 1,
        spines: 0,
        mode: XdpMode::Native,
        ..Shape::small()
    });
    let socks = topo.sockets();
    topo.install(0x0001_0001, &[0], 0);
    let mut rng = Rng(7);
    for r in 0..200u32 {
        let (op, dtype) = (Op::ALL[r as usize % 12], Dtype::ALL[r as usize % 8]);
        round(
            &topo,
            &socks,
            0x0001_0001,
            &[0],
            r,
            (op, dtype, 1 + r as usize % 40),
            &mut rng,
        );
    }
    let s = group_stats(&topo.tors[0], 0x0001_0001);
    assert_eq!(
        (s.completed, s.aggregated, s.sent_down, s.sent_up),
        (200, 800, 800, 0),
        "{s:?}"
    );
    assert_ports_balanced(&topo.tors[0]);
}

#[test]
fn sixteen_hosts_two_tors_and_a_spine_every_op_and_type() {
    let topo = Topology::new(Shape {
        tors: 2,
        hosts_per_tor: 8,
        sockets: 1,
        spines: 1,
        mode: XdpMode::Native,
        ..Shape::small()
    });
    let socks = topo.sockets();
    let id = 0x0002_0001;
    topo.install(id, &[0, 1], 0);
    let mut rng = Rng(11);
    let mut rounds = 0u64;
    for op in Op::ALL {
        for dtype in Dtype::ALL.into_iter().filter(|d| op.defined_on(*d)) {
            // The fabric's links have a 1500 B MTU.
            let max = DEFAULT_PAYLOAD_BYTES / element_bytes(op, dtype);
            for k in 0..22 {
                let count = [1, 2, 64, max][k % 4];
                round(
                    &topo,
                    &socks,
                    id,
                    &[0, 1],
                    rounds as u32,
                    (op, dtype, count),
                    &mut rng,
                );
                rounds += 1;
            }
        }
    }
    assert!(rounds >= 2000);
    for t in 0..2 {
        let s = group_stats(&topo.tors[t], id);
        assert_eq!(s.aggregated, rounds * 8, "TOR {t}: {s:?}");
        assert_eq!(s.completed, rounds, "TOR {t}: {s:?}");
        assert_eq!(s.sent_up, rounds, "TOR {t}: {s:?}");
        assert_eq!(s.results_down, rounds, "TOR {t}: {s:?}");
        assert_eq!(s.sent_down, rounds * 8, "TOR {t}: {s:?}");
        assert_eq!(
            (
                s.duplicates,
                s.stale,
                s.mismatch,
                s.not_member,
                s.unsupported
            ),
            (0, 0, 0, 0, 0),
            "TOR {t}"
        );
        assert_ports_balanced(&topo.tors[t]);
    }
    let s = group_stats(&topo.spines[0], id);
    assert_eq!(
        (s.aggregated, s.completed, s.sent_down),
        (rounds * 2, rounds, rounds * 2),
        "SPINE: {s:?}"
    );
    assert_ports_balanced(&topo.spines[0]);
}

#[test]
fn concurrent_groups_on_two_spines_with_ordinary_traffic_alongside() {
    let topo = Topology::new(Shape {
        tors: 2,
        hosts_per_tor: 3,
        sockets: 1,
        spines: 2,
        mode: XdpMode::Native,
        ..Shape::small()
    });
    let socks = topo.sockets();
    let (a, b, c) = (0x0003_0001, 0x0003_0002, 0x0003_0003);
    topo.install(a, &[0, 1], 0);
    topo.install(b, &[0, 1], 1);
    topo.install(c, &[1], 0); // a one-TOR group: TOR 1 is its root

    // TCP across the TORs (through SPINE 0's bridge) while the groups run.
    let server_ip = topo.hosts[5].ip;
    let listener = topo.hosts[5]
        .ns
        .run(|| TcpListener::bind((server_ip, 7100)).expect("listen"));
    let payload: Vec<u8> = (0..512 * 1024)
        .map(|i| u8::try_from(i % 253).expect("below 253"))
        .collect();
    let mut rng = Rng(13);
    std::thread::scope(|s| {
        let rx = s.spawn(|| {
            let (mut conn, _) = listener.accept().expect("accept");
            let mut got = vec![];
            conn.read_to_end(&mut got).expect("read");
            got
        });
        let tx = s.spawn(|| {
            topo.hosts[0].ns.run(|| {
                let mut c = TcpStream::connect((server_ip, 7100)).expect("connect");
                c.write_all(&payload).expect("write");
            });
        });
        for r in 0..300u32 {
            let (op, dtype) = (Op::ALL[r as usize % 12], Dtype::ALL[(r as usize / 12) % 8]);
            round(&topo, &socks, a, &[0, 1], r, (op, dtype, 16), &mut rng);
            round(
                &topo,
                &socks,
                b,
                &[0, 1],
                r,
                (Op::Sum, Dtype::I64, 100),
                &mut rng,
            );
            round(
                &topo,
                &socks,
                c,
                &[1],
                r,
                (Op::Bor, Dtype::U32, 3),
                &mut rng,
            );
        }
        tx.join().expect("sender");
        assert_eq!(
            rx.join().expect("receiver"),
            payload,
            "TCP across the fabric is intact"
        );
    });
    run(topo.hosts[1].ns.command("ping").args([
        "-c",
        "3",
        "-i",
        "0.2",
        "-W",
        "2",
        &topo.hosts[4].ip.to_string(),
    ]));

    assert_eq!(group_stats(&topo.spines[0], a).completed, 300);
    assert_eq!(group_stats(&topo.spines[1], b).completed, 300);
    assert_eq!(group_stats(&topo.tors[1], c).completed, 300);
    let spine0 = GroupMaps::open(&topo.spines[0].pins.layout)
        .expect("maps")
        .list()
        .expect("list");
    assert!(
        spine0.iter().all(|g| g.id != b && g.id != c),
        "SPINE 0 holds only group a"
    );
    for sw in topo.tors.iter().chain(&topo.spines) {
        assert_ports_balanced(sw);
    }
}

#[test]
fn skb_mode_two_levels() {
    let topo = Topology::new(Shape {
        tors: 2,
        hosts_per_tor: 2,
        sockets: 1,
        spines: 1,
        mode: XdpMode::Skb,
        ..Shape::small()
    });
    let socks = topo.sockets();
    topo.install(0x0004_0001, &[0, 1], 0);
    let mut rng = Rng(17);
    for r in 0..100u32 {
        round(
            &topo,
            &socks,
            0x0004_0001,
            &[0, 1],
            r,
            (Op::ALL[r as usize % 12], Dtype::I32, 50),
            &mut rng,
        );
    }
    assert_eq!(group_stats(&topo.spines[0], 0x0004_0001).completed, 100);
}
