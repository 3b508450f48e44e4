//! The emulated BlueField-style DPU of the test fabrics: each node's host reaches its TOR
//! only through a DPU namespace (representors `pf0hpf` and `p0`, the eswitch a bridge
//! between them). The host namespace holds `eth0` alone, with no XDP program; the DPUs'
//! eswitches carry every packet, so the switch modes and the host algorithms run through
//! them unchanged, every result checked.

use innet::client::{Algorithm, Grouping, Layout, Mode, Path};
use innet_common::proto::{Dtype, Op};
use innet_tests::{
    daemons::{daemons_on, learn_hosts},
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
