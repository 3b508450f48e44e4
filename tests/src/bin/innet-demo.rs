//! `cargo xtask demo`: a TOR bridge host with four hosts in network namespaces, innet's
//! classifier attached natively to every bridge port, INC traffic in a ring (as seed 000's
//! data plane sends it), control packets to the MRR, ping and plain UDP across the bridge;
//! then `innet status` and `innet stats`, and a teardown that also runs on Ctrl-C.

use std::{net::UdpSocket, path::PathBuf, process::Command, time::Duration};

use innet_common::{
    codec::{Addressing, data_header, encode, encode_control, encode_elements},
    proto::{Dtype, Op, PacketKind},
    wire::{ControlPayload, ETH_LEN, IPV4_LEN, UDP_LEN},
};
use innet_tests::{NetNs, PinRoot, ip, run, unique_id};

const HOSTS: usize = 4;
const ROUNDS: u8 = 50;

fn host_ip(i: usize) -> String {
    format!("10.210.0.{}", i + 1)
}

#[expect(
    clippy::too_many_lines,
    reason = "one linear scenario: build, send, show, tear down"
)]
fn main() {
    let pid_prefix = format!("innet-test-{}x", std::process::id() % 10_000);
    ctrlc::set_handler(move || {
        eprintln!("\ninterrupted: tearing the demo topology down");
        teardown_by_prefix(&pid_prefix);
        std::process::exit(130);
    })
    .expect("install the Ctrl-C handler");

    let innet = std::env::var_os("INNET_BIN").map_or_else(innet_tests::innet_bin, PathBuf::from);
    let switch = NetNs::new("tor");
    switch.ip(&["link", "add", "br0", "type", "bridge"]);
    switch.ip(&["link", "set", "br0", "up"]);
    let id = unique_id();
    let hosts: Vec<NetNs> = (0..HOSTS).map(|i| NetNs::new(&format!("h{i}"))).collect();
    let mut ports = vec![];
    for (i, h) in hosts.iter().enumerate() {
        let (hif, pif) = (format!("eth{i}"), format!("p{i}x{id}"));
        ip(&[
            "link",
            "add",
            &hif,
            "netns",
            &h.name,
            "type",
            "veth",
            "peer",
            "name",
            &pif,
            "netns",
            &switch.name,
        ]);
        h.ip(&["addr", "add", &format!("{}/24", host_ip(i)), "dev", &hif]);
        h.ip(&["link", "set", &hif, "up"]);
        switch.ip(&["link", "set", &pif, "master", "br0"]);
        switch.ip(&["link", "set", &pif, "up"]);
        ports.push(pif);
    }
    let pins = PinRoot::new();
    let innet_cmd = |args: &[&str]| {
        let mut c = switch.command(innet.to_str().expect("utf-8 path"));
        c.args(args).arg("--pin-path").arg(pins.path());
        c
    };
    let mut attach = innet_cmd(&["attach", "--mode", "native"]);
    attach.args(&ports);
    run(&mut attach);
    println!(
        "topology: TOR bridge br0 with ports {} → hosts {}",
        ports.join(" "),
        (0..HOSTS).map(host_ip).collect::<Vec<_>>().join(" ")
    );
    std::thread::sleep(Duration::from_millis(300));

    // Ring: host i sends its contribution to host i+1 through the TOR, like seed 000's SRRs.
    let group = 0x005e_ed01;
    let receivers: Vec<UdpSocket> = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| h.run(|| UdpSocket::bind((host_ip(i), 4791)).expect("bind")))
        .collect();
    for r in &receivers {
        r.set_read_timeout(Some(Duration::from_secs(3)))
            .expect("timeout");
    }
    let mut sent = 0usize;
    for (i, h) in hosts.iter().enumerate() {
        h.run(|| {
            let s = UdpSocket::bind((host_ip(i), 0)).expect("bind");
            let next = host_ip((i + 1) % HOSTS);
            for round in 0..ROUNDS {
                let values: Vec<i64> = (0..64).map(|e| (i as i64 + 1) * e).collect();
                let hdr = data_header(group, i as u32, Op::Sum, Dtype::I32, round, 0, 64);
                let frame = encode(
                    &Addressing::default(),
                    &hdr,
                    &encode_elements(Dtype::I32, &values, None),
                );
                s.send_to(
                    &frame[ETH_LEN + IPV4_LEN + UDP_LEN..],
                    (next.as_str(), 4791),
                )
                .expect("send");
            }
            if i != 0 {
                let q = encode_control(
                    &Addressing::default(),
                    PacketKind::Query,
                    i as u32,
                    &ControlPayload::default(),
                );
                s.send_to(
                    &q[ETH_LEN + IPV4_LEN + UDP_LEN..],
                    (host_ip(0).as_str(), 4791),
                )
                .expect("send");
            }
        });
        sent += usize::from(ROUNDS) + usize::from(i != 0);
    }
    let mut received = 0usize;
    let mut buf = [0u8; 2048];
    for r in &receivers {
        while r.recv_from(&mut buf).is_ok() {
            received += 1;
            if received == sent {
                break;
            }
        }
        r.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
    }
    run(hosts[0]
        .command("ping")
        .args(["-c", "3", "-i", "0.2", "-q", &host_ip(3)]));
    println!("INC datagrams sent {sent}, received intact through the bridge {received}");

    for args in [&["status"][..], &["stats", "--extended"][..]] {
        println!("\n$ innet {}", args.join(" "));
        print!(
            "{}",
            String::from_utf8_lossy(&run(&mut innet_cmd(args)).stdout)
        );
    }
    assert_eq!(received, sent, "every INC datagram crossed the TOR");
    drop(pins);
    drop(hosts);
    drop(switch);
    println!("\ntopology torn down");
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
