//! The emulated BlueField-style DPU of the test fabrics: each node's host reaches its TOR
//! only through a DPU namespace (representors `pf0hpf` and `p0`, the eswitch a bridge
//! between them). The host namespace holds `eth0` alone, with no XDP program; the DPUs'
//! eswitches carry every packet, so the switch modes and the host algorithms run through
//! them unchanged, every result checked.

use innet::client::{Algorithm, Grouping, Layout, Mode, Path};
use innet_common::proto::{Dtype, Op};
use innet_tests::{
    daemons::{daemons_on, dpu_daemons_on, learn_hosts},
    job::{checked_allreduce, run_job},
    topology::{DPU_HOST_PORT, DPU_UPLINK, Options, Shape, Topology},
};

fn links(ns: &innet_tests::NetNs) -> Vec<serde_json::Value> {
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

/// A fabric of plain bridges whose nodes have DPUs, each running `innet daemon --role dpu`.
fn dpu_fabric() -> (Topology, Vec<innet_tests::daemons::DaemonGuard>) {
    let topo = Topology::with(
        Shape::small(),
        Options {
            dpus: true,
            ..Options::default()
        },
    );
    learn_hosts(&topo);
    let daemons = dpu_daemons_on(&topo, &[]);
    (topo, daemons)
}

/// The DPU's counters of its member of group `id`.
fn dpu_member(h: &innet_tests::topology::Host, id: u32) -> innet::group::GroupInfo {
    let dpu = h.dpu.as_ref().expect("a DPU");
    dpu.ns.run(|| {
        innet::group::GroupMaps::open(&dpu.pins.layout)
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
}
