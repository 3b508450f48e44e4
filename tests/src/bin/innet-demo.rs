//! `cargo xtask demo`: the built-in fabric — 2 TOR bridge hosts × 4 hosts under one SPINE,
//! all in network namespaces, innet attached natively to every switch port. One reduction
//! group spans all 8 hosts; each host sends its contribution to its ring successor with a
//! plain UDP socket, the TORs and the SPINE aggregate in XDP, and every host receives the
//! result, checked against the host reference. Prints a table and the switches' counters,
//! then tears everything down (also on Ctrl-C).

use std::{net::UdpSocket, path::PathBuf, process::Command, time::Instant};

use innet::loader::Mode;
use innet_common::{
    proto::{Dtype, Op, element_bytes},
    reduce::reduce_all,
};
use innet_tests::topology::{Shape, Topology, body_of, contribution, output};

const GROUP: u32 = 0x00de_0001;
const ROUNDS: u32 = 1000;

fn main() {
    let prefix = format!("innet-test-{}x", std::process::id() % 10_000);
    ctrlc::set_handler(move || {
        eprintln!("\ninterrupted: tearing the demo fabric down");
        teardown_by_prefix(&prefix);
        std::process::exit(130);
    })
    .expect("install the Ctrl-C handler");

    let innet = std::env::var_os("INNET_BIN").map_or_else(innet_tests::innet_bin, PathBuf::from);
    println!("building the fabric: 2 TORs × 4 hosts + 1 SPINE, innet on every switch port …");
    let topo = Topology::new(Shape {
        tors: 2,
        hosts_per_tor: 4,
        sockets: 1,
        spines: 1,
        mode: Mode::Native,
    });
    topo.install(GROUP, &[0, 1], 0);
    let socks = topo.sockets();

    println!(
        "\n{:<8} {:<8} {:>6} {:>7} {:>14} {:>8}",
        "op", "type", "elems", "rounds", "avg µs/round", "correct"
    );
    let cases = [
        (Op::Sum, Dtype::I32, 1),
        (Op::Sum, Dtype::I32, 64),
        (Op::Max, Dtype::U64, 32),
        (Op::Minloc, Dtype::I32, 16),
        (Op::Bxor, Dtype::U8, 256),
        (Op::Prod, Dtype::I16, 128),
    ];
    let mut round_id = 0u8;
    let mut all_ok = true;
    for (op, dtype, count) in cases {
        let size = count * element_bytes(op, dtype);
        let mut correct = 0;
        let start = Instant::now();
        for r in 0..ROUNDS {
            let bodies: Vec<Vec<u8>> = (0..topo.hosts.len())
                .map(|h| {
                    (0..size)
                        .map(|b| (r as usize * 31 + h * 7 + b) as u8)
                        .collect()
                })
                .collect();
            let expected = reduce_all(
                op,
                dtype,
                &bodies.iter().map(Vec::as_slice).collect::<Vec<_>>(),
            )
            .expect("reference");
            send_round(&topo, &socks, round_id, (op, dtype), &bodies);
            let mut buf = [0u8; 2048];
            let ok = socks.iter().all(|s| {
                s.recv_from(&mut buf)
                    .is_ok_and(|(n, _)| body_of(&buf[..n], size) == &expected[..])
            });
            correct += u32::from(ok);
            round_id = round_id.wrapping_add(1);
        }
        let avg = start.elapsed().as_secs_f64() * 1e6 / f64::from(ROUNDS);
        all_ok &= correct == ROUNDS;
        println!(
            "{:<8} {:<8} {count:>6} {ROUNDS:>7} {avg:>14.1} {:>8}",
            op.name(),
            dtype.name(),
            if correct == ROUNDS {
                "yes".to_owned()
            } else {
                format!("{correct}/{ROUNDS}")
            }
        );
    }
    println!("(one process drives all 8 hosts, so a round's time includes 8 sends and 8 receives)");

    for (name, sw) in [
        ("TOR 0", &topo.tors[0]),
        ("TOR 1", &topo.tors[1]),
        ("SPINE 0", &topo.spines[0]),
    ] {
        let mut cmd = sw.ns.command(innet.to_str().expect("utf-8 path"));
        cmd.args(["group", "list", "--pin-path"])
            .arg(sw.pins.layout.root());
        println!("\n{name}: innet group list\n{}", output(&mut cmd));
    }
    drop(socks);
    drop(topo);
    println!("fabric torn down");
    assert!(all_ok, "some rounds gave wrong results");
}

/// Every host sends its contribution to its ring successor under its TOR.
fn send_round(
    topo: &Topology,
    socks: &[UdpSocket],
    round: u8,
    (op, dtype): (Op, Dtype),
    bodies: &[Vec<u8>],
) {
    for (i, host) in topo.hosts.iter().enumerate() {
        let peers: Vec<usize> = topo.hosts_of(host.tor).map(|(j, _)| j).collect();
        let pos = peers.iter().position(|&j| j == i).expect("member");
        let next = topo.hosts[peers[(pos + 1) % peers.len()]].ip;
        socks[i]
            .send_to(
                &contribution(GROUP, i as u32, round, op, dtype, &bodies[i]),
                (next, 4791),
            )
            .expect("send");
    }
}

/// Deletes every namespace and pin root this process created (the Ctrl-C path, where the
/// guards' destructors do not run).
fn teardown_by_prefix(prefix: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            if name.starts_with(prefix) {
                let _ = Command::new("ip").args(["netns", "del", name]).status();
            }
        }
    }
    if let Ok(dir) = std::fs::read_dir("/sys/fs/bpf") {
        for e in dir.flatten() {
            if e.file_name().to_string_lossy().starts_with(prefix) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}
