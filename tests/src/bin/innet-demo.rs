//! `cargo xtask demo`: the built-in fabric — 2 TOR bridge hosts × 4 nodes under one SPINE,
//! each node with two CPU sockets and a NIC per socket, each NIC behind an emulated
//! BlueField-style DPU, all in network namespaces, with `innet daemon` on every switch,
//! `innet daemon --role nic` on every node's first NIC and `innet daemon --role dpu` on its
//! DPU. A job of 32 ranks (4 per node, 2 per socket) joins one communicator per mode —
//! inc-node, inc-socket, inc-nic, inc-dpu, auto, host-rd, host-ring — and runs
//! allreduces of several sizes, int32 and float (float sums must come back with the
//! reference's exact bits), each checked on every rank against the host reference.
//! Prints a table and the switches' counters, then tears everything down (also on Ctrl-C
//! or failure).

use std::{path::PathBuf, time::Instant};

use innet::{
    client::{Layout, Mode},
    loader::Mode as XdpMode,
};
use innet_common::proto::{Dtype, Op, element_bytes};
use innet_tests::{
    daemons::{daemons_on, dpu_daemons_on, learn_hosts, nic_daemons_on},
    job::{expected, input, path_name, run_job},
    topology::{Options, Shape, Topology, output},
};

/// (op, type, bytes, iterations) per mode: the seed's small int32 sums, full packets and a
/// message of 12 packets, then float sums, up to a long float64 message.
const RUNS: [(Op, Dtype, usize, usize); 7] = [
    (Op::Sum, Dtype::I32, 4, 400),
    (Op::Sum, Dtype::I32, 256, 400),
    (Op::Sum, Dtype::I32, 1408, 300),
    (Op::Sum, Dtype::I32, 16 * 1024, 60),
    (Op::Sum, Dtype::F32, 256, 300),
    (Op::Sum, Dtype::F64, 1408, 200),
    (Op::Sum, Dtype::F64, 256 * 1024, 4),
];
/// Distinct inputs cycled through (the expected results are computed once each).
const CASES: usize = 4;

#[expect(
    clippy::too_many_lines,
    reason = "the demo reads top to bottom: fabric, jobs, table, counters, teardown"
)]
fn main() {
    innet_tests::tear_down_on_interrupt("the demo");

    let innet = std::env::var_os("INNET_BIN").map_or_else(innet_tests::innet_bin, PathBuf::from);
    println!(
        "building the fabric: 2 TORs × 4 nodes (2 sockets, a NIC each, behind a DPU) + 1 SPINE …"
    );
    let topo = Topology::with(
        Shape {
            tors: 2,
            hosts_per_tor: 4,
            sockets: 2,
            spines: 1,
            mode: XdpMode::Native,
        },
        Options {
            innet: true,
            dpus: true,
            ..Options::default()
        },
    );
    learn_hosts(&topo);
    let daemons = daemons_on(&topo, &[]);
    println!("starting a NIC daemon on every node (NIC-triggered trees) …");
    let nic_daemons = nic_daemons_on(&topo, &[]);
    println!("starting a DPU daemon on every node's DPU (the same trees on the SmartNICs) …");
    // A node runs one job here: a few groups' maps are enough.
    let dpu_daemons = dpu_daemons_on(&topo, &["--capacity", "8"]);
    let layout = Layout::new(32, 4, 2).expect("layout");
    let answers: Vec<Vec<Vec<u8>>> = RUNS
        .iter()
        .map(|&(op, dtype, bytes, _)| {
            (0..CASES)
                .map(|c| expected(layout.size, c, op, dtype, bytes / element_bytes(op, dtype)))
                .collect()
        })
        .collect();

    println!(
        "\n{:<11} {:<16} {:>5} {:<11} {:>7} {:>6} {:>12} {:>9} {:>8}",
        "mode", "path", "ranks", "op/type", "bytes", "iters", "avg µs", "fallback", "correct"
    );
    let mut all_ok = true;
    for mode in [
        Mode::IncNode,
        Mode::IncSocket,
        Mode::IncNic,
        Mode::IncDpu,
        Mode::Auto,
        Mode::HostRd,
        Mode::HostRing,
    ] {
        let rows = run_job(
            &topo,
            layout,
            mode,
            |_| {},
            |comm| {
                let mut rows = vec![];
                for (s, &(op, dtype, bytes, iters)) in RUNS.iter().enumerate() {
                    let count = bytes / element_bytes(op, dtype);
                    let inputs: Vec<Vec<u8>> = (0..CASES)
                        .map(|c| input(comm.rank(), c, op, dtype, count))
                        .collect();
                    let mut recv = vec![0u8; bytes];
                    let (mut correct, mut fallbacks, mut path) = (0, 0, None);
                    let start = Instant::now();
                    for i in 0..iters {
                        let r = comm
                            .allreduce(&inputs[i % CASES], &mut recv, op, dtype)
                            .unwrap_or_else(|e| panic!("rank {}: {e}", comm.rank()));
                        correct += usize::from(recv == answers[s][i % CASES]);
                        fallbacks += usize::from(r.fallback.is_some());
                        path = Some(r.path);
                    }
                    let avg = start.elapsed().as_secs_f64() * 1e6 / iters as f64;
                    rows.push((bytes, iters, avg, path, fallbacks, correct));
                }
                rows
            },
        );
        for (s, &(op, dtype, bytes, iters)) in RUNS.iter().enumerate() {
            let correct: usize = rows.iter().map(|r| r[s].5).sum();
            let fallbacks: usize = rows.iter().map(|r| r[s].4).sum();
            let ok = correct == iters * layout.size;
            all_ok &= ok;
            println!(
                "{:<11} {:<16} {:>5} {:<11} {:>7} {:>6} {:>12.1} {:>9} {:>8}",
                mode.name(),
                rows[0][s].3.map_or("-", path_name),
                layout.size,
                format!("{}/{}", op.name(), dtype.name()),
                bytes,
                iters,
                rows[0][s].2,
                fallbacks,
                if ok {
                    "yes".to_owned()
                } else {
                    format!("{correct}/{}", iters * layout.size)
                }
            );
        }
    }
    println!(
        "(latency as rank 0 sees it; every rank is a thread of this one process on {} CPUs)",
        std::thread::available_parallelism().map_or(1, usize::from)
    );

    for (name, sw) in [
        ("TOR 0", &topo.tors[0]),
        ("TOR 1", &topo.tors[1]),
        ("SPINE 0", &topo.spines[0]),
    ] {
        let mut cmd = sw.ns.command(innet.to_str().expect("utf-8 path"));
        cmd.args(["stats", "--pin-path"]).arg(sw.pins.layout.root());
        println!("\n{name}: innet stats\n{}", output(&mut cmd));
    }
    let node0 = topo.host(0, 0);
    let mut cmd = node0.ns.command(innet.to_str().expect("utf-8 path"));
    cmd.args(["stats", "--pin-path"])
        .arg(node0.pins.layout.root());
    println!(
        "\nnode 0's NIC (root of the inc-nic tree): innet stats\n{}",
        output(&mut cmd)
    );
    let dpu0 = node0.dpu.as_ref().expect("a DPU");
    let mut cmd = dpu0.ns.command(innet.to_str().expect("utf-8 path"));
    cmd.args(["stats", "--pin-path"])
        .arg(dpu0.pins.layout.root());
    println!(
        "\nnode 0's DPU (root of the inc-dpu tree): innet stats\n{}",
        output(&mut cmd)
    );
    drop(dpu_daemons);
    drop(nic_daemons);
    drop(daemons);
    drop(topo);
    println!("fabric torn down");
    assert!(all_ok, "some allreduces gave wrong results");
}
