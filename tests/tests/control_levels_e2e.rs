//! The control plane on a three-level fabric (TOR → aggregation → core), one daemon per
//! switch: the library's handshake builds the tree at the level its members need (a core
//! for a group across pods, an aggregation switch inside one pod, a TOR for one rack),
//! rounds run through it, and the kill and the idle collection free it at every level.

use std::{net::UdpSocket, time::Duration};

use innet_client::handshake::{GroupParams, Notices, Want, random_group_id};
use innet_common::{
    proto::{Dtype, Op},
    stats::DaemonStats,
};
use innet_lab::{
    daemons::{daemons_on, installed, leader, learn_hosts, rounds, wait_until},
    topology::{Shape, Switch, Topology},
};

/// The group of hosts `members` (the first is the MRR) set up by the library's handshake:
/// the MRR's parameters and notices, and what each NMRR was told.
fn set_up(
    topo: &Topology,
    socks: &[UdpSocket],
    members: &[usize],
) -> ((GroupParams, Notices), Vec<GroupParams>) {
    let comm = random_group_id();
    let mrr = topo.hosts[members[0]].ip;
    let nmrrs: Vec<_> = members[1..].iter().map(|&h| topo.hosts[h].ip).collect();
    let want = Want {
        op: Op::Sum,
        dtype: Dtype::U32,
        packet_bytes: 16,
    };
    std::thread::scope(|s| {
        let joins: Vec<_> = members[1..]
            .iter()
            .map(|&h| {
                let n = members.len() as u16;
                s.spawn(move || leader(topo, socks, h).join(mrr, comm, n).expect("join"))
            })
            .collect();
        let created = leader(topo, socks, members[0])
            .create(&nmrrs, comm, want)
            .expect("create");
        let joined = joins
            .into_iter()
            .map(|j| j.join().expect("joiner"))
            .collect();
        (created, joined)
    })
}

/// The switches of `topo` holding `wire`, with their number of children and root flag.
fn holders(topo: &Topology, wire: u32) -> Vec<(&Switch, u8, bool)> {
    topo.switches()
        .filter_map(|sw| {
            installed(sw, wire).map(|g| (sw, g.config.n_children, g.config.is_root != 0))
        })
        .collect()
}

fn daemon_stats(sw: &Switch) -> DaemonStats {
    innet::stats::read_daemon(&sw.pins.layout).expect("daemon stats")
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario: groups set up at every level, then collected when idle"
)]
fn trees_rise_as_high_as_their_members_need() {
    // 2 pods × 2 TORs × 2 hosts, 2 aggregation switches per pod, 2 cores.
    let topo = Topology::new(Shape::three_level(2, 2, 2, 2, 2));
    let socks = topo.sockets();
    let _daemons = daemons_on(&topo, &["--idle-timeout", "3"]);
    learn_hosts(&topo);

    // Across both pods: rooted at a core, one aggregation switch per pod, every TOR.
    let all: Vec<usize> = (0..8).collect();
    let ((created, notices), joined) = set_up(&topo, &socks, &all);
    assert!(created.in_network(), "{created:?}");
    assert!(
        joined
            .iter()
            .all(|j| j.in_network() && j.wire_id == created.wire_id)
    );
    let core = topo
        .spines
        .iter()
        .find(|c| c.ip == created.spine)
        .expect("rooted at a core");
    let held = holders(&topo, created.wire_id);
    let at = |level: usize| held.iter().filter(|(sw, ..)| sw.level == level).count();
    assert_eq!(
        (at(1), at(2), at(3)),
        (4, 2, 1),
        "every TOR, one switch per pod, one core"
    );
    for (sw, children, root) in &held {
        assert_eq!(*children, 2, "{} has two children", sw.ip);
        assert_eq!(*root, sw.ip == core.ip, "{} root", sw.ip);
    }
    let aggs: Vec<_> = held
        .iter()
        .filter(|(sw, ..)| sw.level == 2)
        .map(|(sw, ..)| sw.pod)
        .collect();
    assert_eq!(
        aggs,
        vec![Some(0), Some(1)],
        "one aggregation switch in each pod"
    );
    rounds(&topo, &socks, &all, created.wire_id, (0, 20));
    let completed = installed(core, created.wire_id)
        .expect("core")
        .stats
        .completed;
    assert_eq!(completed, 20, "every round completes at the core");
    leader(&topo, &socks, 0).kill(&notices).expect("kill");
    for sw in topo.switches() {
        wait_until("the kill frees every level", Duration::from_secs(5), || {
            installed(sw, created.wire_id).is_none()
        });
    }

    // Inside pod 1 (hosts 4–7): rooted at one of its aggregation switches; no core.
    let pod1: Vec<usize> = (4..8).collect();
    let ((inner, inner_notices), _) = set_up(&topo, &socks, &pod1);
    assert!(inner.in_network(), "{inner:?}");
    let held = holders(&topo, inner.wire_id);
    let root: Vec<_> = held.iter().filter(|(_, _, root)| *root).collect();
    assert_eq!(root.len(), 1);
    assert_eq!(
        (root[0].0.level, root[0].0.pod),
        (2, Some(1)),
        "an aggregation switch of pod 1"
    );
    assert_eq!(inner.spine, root[0].0.ip);
    assert_eq!(held.len(), 3, "two TORs and their aggregation switch");
    rounds(&topo, &socks, &pod1, inner.wire_id, (0, 10));
    leader(&topo, &socks, 4).kill(&inner_notices).expect("kill");

    // One rack (hosts 2, 3): its TOR alone.
    let rack = [2, 3];
    let ((one, _), _) = set_up(&topo, &socks, &rack);
    let held = holders(&topo, one.wire_id);
    assert_eq!(held.len(), 1);
    assert_eq!((held[0].0.ip, held[0].2), (topo.tors[1].ip, true));
    assert_eq!(one.spine, std::net::Ipv4Addr::UNSPECIFIED);
    rounds(&topo, &socks, &rack, one.wire_id, (0, 5));

    // Abandoned groups are collected at every level (idle timeout 3 s).
    let ((idle, _), _) = set_up(&topo, &socks, &all);
    rounds(&topo, &socks, &all, idle.wire_id, (0, 3));
    for sw in topo.switches() {
        wait_until(
            "idle collection at every level",
            Duration::from_secs(15),
            || installed(sw, idle.wire_id).is_none() && installed(sw, one.wire_id).is_none(),
        );
    }
    let climbs_back: u64 = topo
        .spines
        .iter()
        .map(|c| daemon_stats(c).climbs_returned)
        .sum();
    assert!(climbs_back > 0, "the cores sent the MRRs' climbs back");
    for sw in topo.switches() {
        let d = daemon_stats(sw);
        assert_eq!(
            (
                d.refused_wrong_port,
                d.refused_not_mrr,
                d.no_route,
                d.paths_full
            ),
            (0, 0, 0, 0),
            "{}: nothing refused or lost",
            sw.ip
        );
    }
}
