//! The emulated BlueField-style DPU of the test fabrics: each node's host reaches its TOR
//! only through a DPU namespace (representors `pf0hpf` and `p0`, the eswitch a bridge
//! between them). The host namespace holds `eth0` alone, with no XDP program; the DPUs'
//! eswitches carry every packet, so the switch modes and the host algorithms run through
//! them unchanged, every result checked.

use std::time::Duration;

use innet_client::{Algorithm, Fallback, Grouping, Layout, Mode, Path, Report};
use innet_common::fail::FAIL_NO_DPU;
use innet_common::{
    codec::{Addressing, data_header, encode, encode_control},
    fault::{KIND_CONTRIBUTION, KIND_RESULT},
    proto::{Dtype, Op, PacketKind},
};
use innet_lab::wire_faults::Faults;
use innet_lab::{
    daemons::{daemons_on, dpu_daemons_on, dpu_fabric, learn_hosts},
    job::{checked_allreduce, run_job},
    topology::{DPU_HOST_PORT, DPU_UPLINK, Dir, Link, Options, Shape, Topology},
};

fn links(ns: &innet_lab::NetNs) -> Vec<serde_json::Value> {
    let out = ns.ip(&["-j", "link", "show"]);
    serde_json::from_slice(&out.stdout).expect("ip -j link")
}

#[test]
fn hosts_reach_the_fabric_only_through_their_dpus() {
    let topo = Topology::with(
        Shape::small(),
        Options {
            innet: true,
            dpus: true,
            ..Options::default()
        },
    );
    for h in &topo.hosts {
        let names: Vec<String> = links(&h.ns)
            .iter()
            .map(|l| l["ifname"].as_str().expect("ifname").to_owned())
            .collect();
        assert_eq!(names, ["lo", "eth0"], "host {}: only its PF", h.ip);
        assert!(
            links(&h.ns).iter().all(|l| l.get("xdp").is_none()),
            "host {}: no XDP program",
            h.ip
        );
        let dpu = h.dpu.as_ref().expect("a DPU per host");
        for rep in [DPU_HOST_PORT, DPU_UPLINK] {
            let l = links(&dpu.ns)
                .into_iter()
                .find(|l| l["ifname"] == rep)
                .unwrap_or_else(|| panic!("DPU of {}: no {rep}", h.ip));
            assert_eq!(l["master"], "br0", "DPU of {}: {rep} in the eswitch", h.ip);
        }
    }
    learn_hosts(&topo);
    let _daemons = daemons_on(&topo, &[]);
    let layout = Layout::new(4, 1, 1).expect("layout");
    for (mode, path) in [
        (Mode::IncNode, Path::Network(Grouping::Node)),
        (Mode::HostRing, Path::Host(Algorithm::Ring)),
    ] {
        let reports = run_job(
            &topo,
            layout,
            mode,
            |_| {},
            |comm| {
                [(Op::Sum, Dtype::I32, 300), (Op::Max, Dtype::F64, 5000)]
                    .into_iter()
                    .enumerate()
                    .map(|(k, (op, dtype, count))| checked_allreduce(comm, k, op, dtype, count))
                    .collect::<Vec<_>>()
            },
        );
        for (rank, rs) in reports.iter().enumerate() {
            for r in rs {
                assert_eq!(r.path, path, "{mode}: rank {rank}: {r:?}");
            }
        }
    }
}

/// The DPU's counters of its member of group `id`.
fn dpu_member(h: &innet_lab::topology::Host, id: u32) -> innet::group_maps::GroupInfo {
    let dpu = h.dpu.as_ref().expect("a DPU");
    dpu.ns.run(|| {
        innet::group_maps::GroupMaps::open(&dpu.pins.layout)
            .and_then(|g| g.get(id))
            .unwrap_or_else(|e| panic!("DPU of {}: group {id:#x}: {e}", h.ip))
    })
}

#[test]
fn inc_dpu_reduces_on_the_dpus_and_the_hosts_run_no_bpf() {
    let (topo, _daemons) = dpu_fabric();
    let layout = Layout::new(8, 2, 1).expect("layout");
    let cases = [
        (Op::Sum, Dtype::I32, 1),
        (Op::Sum, Dtype::I64, 3000),
        (Op::Max, Dtype::U8, 200),
        (Op::Sum, Dtype::F64, 700),
        (Op::Minloc, Dtype::F32, 90),
    ];
    let reports = run_job(
        &topo,
        layout,
        Mode::IncDpu,
        |_| {},
        |comm| {
            let rs: Vec<_> = cases
                .iter()
                .enumerate()
                .map(|(k, &(op, dtype, count))| checked_allreduce(comm, k, op, dtype, count))
                .collect();
            // The members live until the leaders leave: read them before.
            let id = comm.group().map(|g| g.wire_id);
            let members = (comm.rank() == 0).then(|| {
                let id = id.expect("a group");
                topo.hosts
                    .iter()
                    .map(|h| dpu_member(h, id))
                    .collect::<Vec<_>>()
            });
            (rs, members)
        },
    );
    for (rank, (rs, _)) in reports.iter().enumerate() {
        for r in rs {
            assert_eq!(r.path, Path::NicTree, "rank {rank}: {r:?}");
            assert_eq!(r.fallback, None, "rank {rank}: {r:?}");
        }
    }
    let members = reports[0].1.as_ref().expect("rank 0 read the members");
    // Every DPU took its host's part and handed it results; no host runs BPF.
    for (h, g) in topo.hosts.iter().zip(members) {
        assert!(g.config.is_dpu(), "DPU of {}: {:?}", h.ip, g.config);
        assert!(
            g.stats.posted > 0,
            "DPU of {}: no own part: {:?}",
            h.ip,
            g.stats
        );
        assert!(
            g.stats.completions > 0,
            "DPU of {}: no result: {:?}",
            h.ip,
            g.stats
        );
        assert_eq!(g.stats.not_member, 0, "DPU of {}: {:?}", h.ip, g.stats);
        assert!(
            links(&h.ns).iter().all(|l| l.get("xdp").is_none()),
            "host {}: no XDP program",
            h.ip
        );
    }
    operators_see_the_dpu(&topo.hosts[0]);
}

/// On a DPU, `bpftool` names the program on both representors and `innet stats` shows the
/// host's port apart from the uplink.
fn operators_see_the_dpu(h: &innet_lab::topology::Host) {
    let dpu = h.dpu.as_ref().expect("a DPU");
    let net = innet_lab::run(dpu.ns.command("bpftool").args(["-j", "net", "show"]));
    let net: serde_json::Value = serde_json::from_slice(&net.stdout).expect("bpftool -j");
    let xdp = net[0]["xdp"].as_array().expect("xdp attachments");
    for rep in [DPU_HOST_PORT, DPU_UPLINK] {
        let id = xdp
            .iter()
            .find(|a| a["devname"] == rep)
            .and_then(|a| a["id"].as_u64())
            .unwrap_or_else(|| panic!("bpftool net show: nothing on {rep}: {xdp:?}"));
        let prog = innet_lab::run(std::process::Command::new("bpftool").args([
            "-j",
            "prog",
            "show",
            "id",
            &id.to_string(),
        ]));
        let prog: serde_json::Value = serde_json::from_slice(&prog.stdout).expect("bpftool -j");
        assert_eq!(prog["name"], "innet_nic", "on {rep}: {prog}");
    }
    let mut stats = dpu
        .ns
        .command(innet_lab::innet_bin().to_str().expect("utf-8"));
    stats
        .args(["stats", "--json", "--pin-path"])
        .arg(dpu.pins.path());
    let stats: serde_json::Value =
        serde_json::from_slice(&innet_lab::run(&mut stats).stdout).expect("stats --json");
    let port = |facing: &str| {
        stats["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .find(|p| p["facing"] == facing)
            .unwrap_or_else(|| panic!("no {facing} port in {stats}"))
            .clone()
    };
    let (host, uplink) = (port("host"), port("uplink"));
    assert_eq!(host["ifname"], DPU_HOST_PORT, "{stats}");
    assert_eq!(uplink["ifname"], DPU_UPLINK, "{stats}");
    // The host's own contributions come in on its port, the rest of the tree's on the
    // uplink; the host's set-up requests are the only control packets handed up.
    assert!(host["counters"]["inc_data"].as_u64() > Some(0), "{stats}");
    assert!(uplink["counters"]["inc_data"].as_u64() > Some(0), "{stats}");
    assert!(host["counters"]["control_up"].as_u64() > Some(0), "{stats}");
    assert_eq!(
        uplink["counters"]["control_up"].as_u64(),
        Some(0),
        "{stats}"
    );
}

/// A DPU fabric whose DPU–TOR links run through fault-injecting wires.
fn wired_dpu_fabric() -> (Topology, Vec<innet_lab::daemons::DaemonGuard>) {
    let topo = Topology::with(
        Shape::small(),
        Options {
            dpus: true,
            wires: true,
            ..Options::default()
        },
    );
    learn_hosts(&topo);
    let daemons = dpu_daemons_on(&topo, &[]);
    (topo, daemons)
}

fn assert_through_dpus(reports: &[Vec<Report>], what: &str) {
    for (rank, rs) in reports.iter().enumerate() {
        for r in rs {
            assert_eq!(r.path, Path::NicTree, "{what}: rank {rank}: {r:?}");
            assert_eq!(r.fallback, None, "{what}: rank {rank}: {r:?}");
        }
    }
}

#[test]
fn loss_between_dpus_and_fabric_is_recovered_with_exact_floats() {
    let (topo, _daemons) = wired_dpu_fabric();
    let layout = Layout::new(4, 1, 1).expect("layout");
    let wires = topo.wires.as_ref().expect("wires");
    let lossy = |host: usize, kinds: u32, drop: f64| {
        let faults = Faults {
            kinds,
            drop,
            ..Faults::default()
        };
        wires.set(Link::Host(host), Dir::Up, faults);
    };
    // A leaf's partials and the root's results (multicasts and answers), dropped on their
    // way from the DPU to the TOR; a host's own results dropped by the library.
    lossy(3, KIND_CONTRIBUTION, 0.25);
    lossy(0, KIND_RESULT, 0.15);
    let reports = run_job(
        &topo,
        layout,
        Mode::IncDpu,
        |c| {
            c.branch_degree = 2;
            c.max_tries = 16;
            c.drop_results_every = 7;
        },
        |comm| {
            (0..30)
                .map(|case| {
                    // Floats: every arrival order must give the reference's bits.
                    let (op, dtype) = [(Op::Sum, Dtype::F64), (Op::Max, Dtype::I64)][case % 2];
                    checked_allreduce(comm, case, op, dtype, 300)
                })
                .collect::<Vec<_>>()
        },
    );
    assert_through_dpus(&reports, "loss");
    let resent: u32 = reports.iter().flatten().map(|r| r.retransmissions).sum();
    assert!(resent > 0, "lost packets must cause resends");
    let (leaf, root) = (
        wires.stats(Link::Host(3), Dir::Up),
        wires.stats(Link::Host(0), Dir::Up),
    );
    assert!(leaf.contributions > 0, "{leaf:?}");
    assert!(root.results > 0, "{root:?}");
}

#[test]
fn a_node_without_a_dpu_daemon_makes_the_group_fall_back() {
    let (topo, mut daemons) = dpu_fabric();
    // Node 2's DPU daemon dies: its leader hears nothing from it and says so; every leader
    // runs on the hosts, through the other DPUs' programs untouched.
    drop(daemons.remove(2));
    let layout = Layout::new(4, 1, 1).expect("layout");
    let reports = run_job(
        &topo,
        layout,
        Mode::IncDpu,
        |c| c.timeout = Duration::from_secs(5),
        |comm| checked_allreduce(comm, 0, Op::Max, Dtype::I32, 10),
    );
    let no_dpu = Some(Fallback::NoNetwork {
        fail_cause: FAIL_NO_DPU,
    });
    for (rank, r) in reports.iter().enumerate() {
        assert!(matches!(r.path, Path::Host(_)), "rank {rank}: {r:?}");
        if rank == 2 {
            assert_eq!(r.fallback, no_dpu, "the rank whose DPU is silent says so");
        } else {
            // Told by the group's setup, or, when that word comes after a peer's fallback
            // (seen on a loaded machine), by the peer.
            assert!(
                r.fallback == no_dpu || r.fallback == Some(Fallback::PeerFellBack),
                "rank {rank}: {r:?}"
            );
        }
    }
}

/// Host 1's addresses to host 0's (MACs of their `eth0`).
fn host_1_to_host_0(topo: &Topology) -> Addressing {
    let (h0, h1) = (&topo.hosts[0], &topo.hosts[1]);
    let mac = |h: &innet_lab::topology::Host| {
        h.ns.run(|| innet_net::netdev::mac("eth0").expect("MAC of eth0"))
    };
    Addressing {
        src_mac: mac(h1),
        dst_mac: mac(h0),
        src_ip: h1.ip,
        dst_ip: h0.ip,
        ..Addressing::default()
    }
}

/// A frame from the fabric side that poses as host 1's own part of group `id`, round
/// `round`: host 1's addresses, its position as `src_rank`.
fn forged_own_part(topo: &Topology, id: u32, round: u8) -> Vec<u8> {
    let addr = Addressing {
        psn: u32::from(round),
        ..host_1_to_host_0(topo)
    };
    let hdr = data_header(id, 1, Op::Sum, Dtype::I32, round, 0, 1);
    encode(&addr, &hdr, &1_000_000i32.to_be_bytes())
}

#[test]
fn an_own_part_forged_on_the_fabric_side_is_refused() {
    let (topo, _daemons) = dpu_fabric();
    let layout = Layout::new(4, 1, 1).expect("layout");
    let tor = &topo.tors[topo.hosts[1].tor];
    let port = topo.hosts[1].tor_port;
    let reports = run_job(
        &topo,
        layout,
        Mode::IncDpu,
        |c| c.branch_degree = 2,
        |comm| {
            let first = checked_allreduce(comm, 0, Op::Sum, Dtype::I32, 1);
            let id = comm.group().expect("a group").wire_id;
            if comm.rank() == 1 {
                // Every round at once, from the TOR into host 1's DPU: none is its own part.
                tor.ns.run(|| {
                    let sock = innet_net::netdev::PacketSocket::new().expect("packet socket");
                    for round in 0..=255 {
                        sock.send(port, &forged_own_part(&topo, id, round))
                            .expect("send the forgery");
                    }
                });
            }
            let rest: Vec<_> = (1..20)
                .map(|case| checked_allreduce(comm, case, Op::Sum, Dtype::I32, 1))
                .collect();
            let member = (comm.rank() == 1).then(|| dpu_member(&topo.hosts[1], id));
            (first, rest, member)
        },
    );
    for (rank, (first, rest, _)) in reports.iter().enumerate() {
        for r in std::iter::once(first).chain(rest) {
            assert_eq!(r.path, Path::NicTree, "rank {rank}: {r:?}");
        }
    }
    let g = reports[1].2.as_ref().expect("rank 1 read its DPU");
    assert!(
        g.stats.not_member >= 256,
        "every forgery refused as no member's: {:?}",
        g.stats
    );
    // Only host 1's own 20 contributions (and its resends) count as its part.
    assert!(g.stats.posted >= 20 && g.stats.posted < 40, "{:?}", g.stats);
}

/// A member whose DPU lost it mid-job (collected, or replaced by a request for another
/// tree): its host's contributions end at its own DPU, and the job goes on on the hosts.
/// Attack it covers: a DPU passes a frame of a group it does not hold on, and a member's
/// DPU knows its children by tree position; a host that addressed its parts to another
/// member (its ring successor) had them taken there as its whole subtree's partial, so
/// every result lacked its children's parts (CI run 23: node 3's part missing, 8 wrong).
#[test]
fn a_member_gone_from_its_dpu_mid_job_never_corrupts_a_result() {
    let (topo, _daemons) = dpu_fabric();
    let layout = Layout::new(4, 1, 1).expect("layout");
    let reports = run_job(
        &topo,
        layout,
        Mode::IncDpu,
        |c| {
            c.branch_degree = 2;
            c.timeout = Duration::from_secs(5);
        },
        |comm| {
            let first = checked_allreduce(comm, 0, Op::Sum, Dtype::I32, 1);
            let id = comm.group().expect("a group").wire_id;
            if comm.rank() == 0 {
                // Member 1 (whose child is member 3) is gone from its DPU, as its idle
                // collector would take it.
                let dpu = topo.hosts[1].dpu.as_ref().expect("a DPU");
                dpu.ns.run(|| {
                    innet::group_maps::GroupMaps::open(&dpu.pins.layout)
                        .and_then(|mut g| g.remove(id))
                        .expect("remove member 1 from its DPU");
                });
            }
            // Checked: each result is every rank's sum, wherever it was computed.
            let rest: Vec<_> = (1..8)
                .map(|case| checked_allreduce(comm, case, Op::Sum, Dtype::I32, 1))
                .collect();
            (first, rest)
        },
    );
    for (rank, (first, rest)) in reports.iter().enumerate() {
        assert_eq!(first.path, Path::NicTree, "rank {rank}: {first:?}");
        assert!(
            rest.iter().any(|r| matches!(r.path, Path::Host(_))),
            "rank {rank}: the tree lost a member, so the job ran on the hosts: {rest:?}"
        );
    }
}

/// Host 1's request for its member again (member 1 of 4, degree 2, parent host 0), as a
/// frame into its DPU's host port.
fn member_1_requested_again(topo: &Topology, true_comm_id: u32) -> Vec<u8> {
    let h0 = &topo.hosts[0];
    let req = innet_net::nic::dpu::DpuRequest {
        comm: true_comm_id,
        me: 1,
        tree: innet_net::nic::tree::Tree::new(4, 2).expect("tree"),
        parent: Some(h0.ip),
        root: h0.ip,
    };
    let addr = host_1_to_host_0(topo);
    encode_control(&addr, PacketKind::Query, 1, &req.to_payload(1))
}

/// The host asks its DPU again for the member it runs (its first answer was slow: it asks
/// again after 50 ms): the DPU answers again and keeps the member with its rounds. It used
/// to reinstall it, losing the rounds in flight, and for the reinstall's length no member
/// took the host's frames.
#[test]
fn a_repeated_request_keeps_the_running_member() {
    let (topo, _daemons) = dpu_fabric();
    let layout = Layout::new(4, 1, 1).expect("layout");
    let dpu = topo.hosts[1].dpu.as_ref().expect("a DPU");
    let reports = run_job(
        &topo,
        layout,
        Mode::IncDpu,
        |c| c.branch_degree = 2,
        |comm| {
            let first = checked_allreduce(comm, 0, Op::Sum, Dtype::I32, 1);
            let group = comm.group().expect("a group");
            let before = (comm.rank() == 1).then(|| dpu_member(&topo.hosts[1], group.wire_id));
            if comm.rank() == 1 {
                let frame = member_1_requested_again(&topo, group.true_comm_id);
                topo.hosts[1].ns.run(|| {
                    let sock = innet_net::netdev::PacketSocket::new().expect("packet socket");
                    let eth0 = innet_net::netdev::ifindex("eth0").expect("eth0");
                    for _ in 0..3 {
                        sock.send(eth0, &frame).expect("send the request");
                    }
                });
            }
            let rest: Vec<_> = (1..30)
                .map(|case| checked_allreduce(comm, case, Op::Sum, Dtype::I32, 1))
                .collect();
            let after = (comm.rank() == 1).then(|| dpu_member(&topo.hosts[1], group.wire_id));
            (first, rest, before.zip(after))
        },
    );
    for (rank, (first, rest, _)) in reports.iter().enumerate() {
        for r in std::iter::once(first).chain(rest) {
            assert_eq!(r.path, Path::NicTree, "rank {rank}: {r:?}");
            assert_eq!(r.fallback, None, "rank {rank}: {r:?}");
        }
    }
    let (before, after) = reports[1].2.as_ref().expect("rank 1 read its DPU");
    assert_eq!(before.config, after.config, "the member as it was");
    assert!(
        after.stats.posted >= before.stats.posted + 29,
        "its counters kept: {:?} then {:?}",
        before.stats,
        after.stats
    );
    let daemon = dpu
        .ns
        .run(|| innet::stats::read_daemon(&dpu.pins.layout).expect("DPU daemon counters"));
    assert_eq!(daemon.setups_repeated, 3, "{daemon:?}");
}
