//! A NIC tree's results reach member ports only (issue 33, item 6). Two plain TOR bridges
//! of three hosts under a SPINE bridge, the fabric's IGMP querier; a job on two hosts of
//! each TOR, the third host of each a bystander. Each member below the root joins its
//! group's result address, so the snooping bridges copy the root's multicast result to
//! member ports only. Counted on the TORs' host ports (what each bridge sends to each
//! host): every member port gets every result, bystanders none; with snooping off (plain
//! flooding bridges, what innet had before) bystanders get every result too. In `inc-nic`
//! and in `inc-dpu` (the DPU joins, on its eswitch bridge).

use std::{collections::HashMap, net::Ipv4Addr};

use innet_client::{Communicator, Config, Layout, Mode, Path};
use innet_common::{
    proto::{Dtype, Op},
    wire::ETH_LEN,
};
use innet_lab::{
    daemons::{DaemonGuard, dpu_daemons_on, learn_hosts, nic_daemons_on},
    job::{checked_allreduce, job_id},
    topology::{Options, Shape, Topology},
};
use innet_tools::capture::{Capture, Captured};

/// Members: the first two hosts of each TOR; bystanders: the third.
const MEMBERS: [usize; 4] = [0, 1, 3, 4];
const BYSTANDERS: [usize; 2] = [2, 5];
/// Allreduces per phase, and their size (several packets each).
const CALLS: usize = 6;
const COUNT: usize = 900;

fn fabric(dpus: bool) -> (Topology, Vec<DaemonGuard>) {
    let topo = Topology::with(
        Shape::two_level(2, 3, 1),
        Options {
            dpus,
            ..Options::default()
        },
    );
    learn_hosts(&topo);
    let daemons = if dpus {
        dpu_daemons_on(&topo, &[])
    } else {
        nic_daemons_on(&topo, &[])
    };
    (topo, daemons)
}

/// A checked job on the member hosts, one rank each.
fn job(topo: &Topology, mode: Mode) {
    let layout = Layout::new(MEMBERS.len(), 1, 1).expect("layout");
    let all = topo.placement();
    let placement: Vec<_> = MEMBERS.iter().map(|&n| all[n].clone()).collect();
    let id = job_id();
    std::thread::scope(|s| {
        for (rank, &node) in MEMBERS.iter().enumerate() {
            let (host, placement) = (&topo.hosts[node], placement.clone());
            s.spawn(move || {
                host.ns.enter();
                let mut cfg = Config::new(id, rank, layout, placement);
                cfg.mode = mode;
                let mut comm = Communicator::new(cfg).expect("joining");
                for case in 0..CALLS {
                    let r = checked_allreduce(&mut comm, case, Op::Sum, Dtype::I32, COUNT);
                    assert_eq!(r.path, Path::NicTree, "rank {rank}: {r:?}");
                }
            });
        }
    });
}

/// Result frames (multicast Ethernet destination) each TOR sent out of each host port, by
/// host, and those that came in from the root's port.
fn results_by_host(
    topo: &Topology,
    captures: Vec<Vec<Captured>>,
) -> (HashMap<Ipv4Addr, usize>, usize) {
    let mut sent = HashMap::new();
    let mut from_root = 0;
    let root = &topo.hosts[MEMBERS[0]];
    for (t, frames) in captures.into_iter().enumerate() {
        for c in frames.iter().filter(|c| is_multicast_result(&c.frame)) {
            let Some((_, h)) = topo.hosts_of(t).find(|(_, h)| h.tor_port == c.ifindex) else {
                continue;
            };
            if c.outgoing {
                *sent.entry(h.ip).or_insert(0) += 1;
            } else if h.ip == root.ip {
                from_root += 1;
            }
        }
    }
    (sent, from_root)
}

fn is_multicast_result(f: &[u8]) -> bool {
    f[..3] == [0x01, 0x00, 0x5e] && f[ETH_LEN + 16] == 239
}

/// Runs the job with every TOR's host ports captured; returns results sent to each host
/// and the root's result count.
fn measured(topo: &Topology, mode: Mode) -> (HashMap<Ipv4Addr, usize>, usize) {
    let captures: Vec<Capture> = topo.tors.iter().map(|t| Capture::start(&t.ns)).collect();
    job(topo, mode);
    results_by_host(topo, captures.into_iter().map(Capture::finish).collect())
}

fn only_members_get_results(dpus: bool, mode: Mode) {
    let (topo, _daemons) = fabric(dpus);
    let (sent, rounds) = measured(&topo, mode);
    eprintln!(
        "{mode:?}, snooping with a querier: {rounds} results from the root; per host {sent:?}"
    );
    assert!(rounds >= CALLS, "{mode:?}: the root sent {rounds} results");
    for &m in &MEMBERS[1..] {
        let ip = topo.hosts[m].ip;
        assert_eq!(
            sent.get(&ip),
            Some(&rounds),
            "{mode:?}: member {ip}: {sent:?}"
        );
    }
    for &b in &BYSTANDERS {
        let ip = topo.hosts[b].ip;
        assert_eq!(sent.get(&ip), None, "{mode:?}: bystander {ip} got results");
    }
    // Members leave with their groups: no result address stays joined anywhere.
    for h in &topo.hosts {
        let ns = h.dpu.as_ref().map_or(&h.ns, |d| &d.ns);
        let joined = String::from_utf8(ns.ip(&["maddr", "show"]).stdout).expect("utf-8");
        assert!(!joined.contains("239."), "{} still joined: {joined}", h.ip);
    }

    // The control: bridges that flood (snooping off) copy every result to bystanders.
    for sw in topo.switches() {
        sw.ns.ip(&[
            "link",
            "set",
            "br0",
            "type",
            "bridge",
            "mcast_snooping",
            "0",
        ]);
    }
    let (flooded, rounds) = measured(&topo, mode);
    eprintln!("{mode:?}, flooding bridges: {rounds} results from the root; per host {flooded:?}");
    for &b in &BYSTANDERS {
        let ip = topo.hosts[b].ip;
        assert_eq!(flooded.get(&ip), Some(&rounds), "{mode:?}: flooded to {ip}");
    }
}

#[test]
fn nic_results_reach_member_ports_only() {
    only_members_get_results(false, Mode::IncNic);
}

#[test]
fn dpu_results_reach_member_ports_only() {
    only_members_get_results(true, Mode::IncDpu);
}
