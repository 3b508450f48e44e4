//! Fabrics of every depth the lab builds (`innet-lab/src/topology.rs`): one TOR, and a
//! three-tier Clos (2 pods × 2 TORs × 2 hosts, 2 aggregation switches per pod, 2 cores).
//! Groups are installed by hand on every switch of their tree (no daemons): every host
//! sends its contribution with a plain UDP socket and must receive the exact int32 sum;
//! ordinary traffic (ping, a UDP datagram) crosses the bridged tree between pods; every
//! namespace is gone once the fabric drops.

use std::{net::UdpSocket, process::Command};

use innet::group_maps::GroupMaps;
use innet_common::proto::{Dtype, Op};
use innet_lab::{
    Rng,
    topology::{Link, Shape, Switch, Topology, body_of, contribution},
};

const COUNT: usize = 64;

/// One fabric at a time: attaching to many ports from parallel tests made the kernel refuse
/// programs on this 2-core machine.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The namespaces of this process's fabrics (`innet-test-<pid>x…`).
/// Drops the fabric (its sockets first) and checks it left no namespace of ours behind.
fn assert_torn_down(topo: Topology, socks: Vec<UdpSocket>) {
    drop(socks);
    drop(topo);
    assert_eq!(
        our_namespaces(),
        Vec::<String>::new(),
        "namespaces left behind"
    );
}

fn our_namespaces() -> Vec<String> {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    let prefix = innet_lab::run_prefix(std::process::id());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&prefix))
        .map(str::to_owned)
        .collect()
}

/// `rounds` allreduce rounds of group `id` over the hosts of `tors`: each host sends to its
/// ring successor under its TOR (the TOR itself when alone), each must get the exact sum.
fn rounds(topo: &Topology, socks: &[UdpSocket], id: u32, tors: &[usize], rounds: u8) {
    let members: Vec<usize> = tors
        .iter()
        .flat_map(|&t| topo.hosts_of(t).map(|(i, _)| i))
        .collect();
    let mut rng = Rng(u64::from(id) | 1);
    let mut buf = [0u8; 2048];
    for r in 0..rounds {
        let values: Vec<Vec<i32>> = members
            .iter()
            .map(|_| (0..COUNT).map(|_| rng.below(2001) as i32 - 1000).collect())
            .collect();
        let expected: Vec<u8> = (0..COUNT)
            .map(|e| values.iter().map(|v| v[e]).sum::<i32>())
            .flat_map(i32::to_be_bytes)
            .collect();
        for (k, &i) in members.iter().enumerate() {
            let next = topo.next_under_tor(i);
            let body: Vec<u8> = values[k].iter().flat_map(|v| v.to_be_bytes()).collect();
            let payload = contribution(id, i as u32, r.into(), Op::Sum, Dtype::I32, &body);
            socks[i].send_to(&payload, (next, 4791)).expect("send");
        }
        for &i in &members {
            let (n, _) = socks[i].recv_from(&mut buf).unwrap_or_else(|e| {
                panic!("group {id:#x}: host {i} got no result in round {r}: {e}")
            });
            assert_eq!(
                body_of(&buf[..n], expected.len()),
                &expected[..],
                "group {id:#x}, host {i}, round {r}"
            );
        }
    }
}

fn completed(sw: &Switch, id: u32) -> u64 {
    GroupMaps::open(&sw.pins.layout)
        .expect("maps")
        .get(id)
        .unwrap_or_else(|e| panic!("group {id:#x} on {}: {e}", sw.ip))
        .stats
        .completed
}

#[test]
fn one_level_fabric() {
    let _serial = serial();
    let topo = Topology::new(Shape::one_level(3));
    assert_eq!(
        (topo.tors.len(), topo.aggs.len(), topo.spines.len()),
        (1, 0, 0)
    );
    assert!(topo.tors[0].uplinks.is_empty());
    let socks = topo.sockets();
    topo.install(0x0001_0001, &[0], 0);
    rounds(&topo, &socks, 0x0001_0001, &[0], 20);
    assert_eq!(completed(&topo.tors[0], 0x0001_0001), 20);
    topo.uninstall(0x0001_0001);
    assert_torn_down(topo, socks);
}

#[test]
fn three_level_clos() {
    let _serial = serial();
    let shape = Shape::three_level(2, 2, 2, 2, 2);
    let topo = Topology::new(shape);
    assert_eq!(
        (
            topo.hosts.len(),
            topo.tors.len(),
            topo.aggs.len(),
            topo.spines.len()
        ),
        (8, 4, 4, 2)
    );
    // The wiring: every TOR to both aggregation switches of its pod, every aggregation
    // switch to both cores; the first parent's link bridged, the others not.
    for (t, tor) in topo.tors.iter().enumerate() {
        let pod = t / 2;
        assert_eq!((tor.level, tor.pod), (1, Some(pod)));
        let parents: Vec<_> = tor.uplinks.iter().map(|p| p.peer).collect();
        assert_eq!(parents, [topo.agg(pod, 0).ip, topo.agg(pod, 1).ip]);
        assert_eq!(
            tor.uplinks.iter().map(|p| p.bridged).collect::<Vec<_>>(),
            [true, false]
        );
        let down = topo.agg(pod, 1).port_to(tor.ip).expect("agg 1 → TOR");
        assert!(!down.bridged);
        assert!(
            topo.agg(pod, 0)
                .port_to(tor.ip)
                .expect("agg 0 → TOR")
                .bridged
        );
    }
    for agg in &topo.aggs {
        assert_eq!(agg.level, 2);
        assert_eq!(agg.ip.octets()[2], 220);
        let cores: Vec<_> = agg.uplinks.iter().map(|p| p.peer).collect();
        assert_eq!(cores, [topo.spines[0].ip, topo.spines[1].ip]);
        assert_eq!(agg.downlinks.len(), 2);
    }
    for core in &topo.spines {
        assert_eq!((core.level, core.downlinks.len()), (3, 4));
    }

    let socks = topo.sockets();
    // Ordinary traffic crosses the bridged tree: pod 0 → pod 1, ping and a UDP datagram.
    let (a, b) = (&topo.hosts[0], &topo.hosts[7]);
    innet_lab::run(
        a.ns.command("ping")
            .args(["-c", "1", "-W", "2", &b.ip.to_string()]),
    );
    let probe = b"across the pods";
    socks[0].send_to(probe, (b.ip, 4791)).expect("send");
    let mut buf = [0u8; 64];
    let (n, from) = socks[7]
        .recv_from(&mut buf)
        .expect("the datagram across the pods");
    assert_eq!(
        (&buf[..n], from.ip()),
        (&probe[..], std::net::IpAddr::V4(a.ip))
    );

    // A group over both pods rooted at core 1, and one inside pod 1 rooted at its
    // aggregation switch 0, at the same time.
    let (wide, pod1) = (0x0002_0001, 0x0002_0002);
    topo.install(wide, &[0, 1, 2, 3], 1);
    topo.install(pod1, &[2, 3], 0);
    rounds(&topo, &socks, wide, &[0, 1, 2, 3], 20);
    rounds(&topo, &socks, pod1, &[2, 3], 20);
    assert_eq!(completed(&topo.spines[1], wide), 20);
    assert_eq!(completed(topo.agg(0, 0), wide), 20);
    assert_eq!(completed(topo.agg(1, 0), pod1), 20);
    assert!(
        GroupMaps::open(&topo.spines[0].pins.layout)
            .expect("maps")
            .get(pod1)
            .is_err()
    );
    // The same wide group through aggregation switch 1 of each pod.
    topo.uninstall(wide);
    topo.install_via(wide, &[0, 1, 2, 3], 1, 0);
    rounds(&topo, &socks, wide, &[0, 1, 2, 3], 10);
    assert_eq!(completed(topo.agg(1, 1), wide), 10);
    assert_eq!(completed(&topo.spines[0], wide), 10);
    topo.uninstall(wide);
    topo.uninstall(pod1);

    assert_torn_down(topo, socks);
}

#[test]
fn three_level_wires_on_every_link() {
    let _serial = serial();
    let topo = Topology::with(
        Shape::three_level(2, 1, 1, 1, 1),
        innet_lab::topology::Options {
            wires: true,
            ..Default::default()
        },
    );
    let mut links: Vec<Link> = topo.wires.as_ref().expect("wires").links().collect();
    links.sort_unstable();
    let up = |level, lower, upper| Link::Uplink {
        level,
        lower,
        upper,
    };
    assert_eq!(
        links,
        [
            Link::Host(0),
            Link::Host(1),
            up(1, 0, 0),
            up(1, 1, 1),
            up(2, 0, 0),
            up(2, 1, 0)
        ]
    );
    // Plain bridges over wires still carry ordinary traffic across the pods.
    let (a, b) = (&topo.hosts[0], &topo.hosts[1]);
    innet_lab::run(
        a.ns.command("ping")
            .args(["-c", "1", "-W", "2", &b.ip.to_string()]),
    );
}

#[test]
#[should_panic(expected = "split the TORs evenly")]
fn uneven_pods_are_refused() {
    let shape = Shape {
        tors: 3,
        ..Shape::three_level(2, 1, 1, 1, 1)
    };
    let _ = Topology::plain(shape);
}
