//! A communicator's INC socket in a process of its own, for the test of address sharing
//! across processes: binds `--ip` for `--comm`/`--pkey`, prints `bound`, then prints each
//! datagram it receives (hex, a line each) until `--count` came or 10 s passed, and then
//! `extra` if anything more arrives within 300 ms.

use std::{io::Write as _, net::Ipv4Addr, time::Duration};

use clap::Parser;
use innet_client::inc_socket;
use innet_common::demux::{comm_key, host_key};

#[derive(Parser)]
struct Args {
    #[arg(long)]
    ip: Ipv4Addr,
    #[arg(long, value_parser = parse_hex)]
    comm: u32,
    #[arg(long, value_parser = parse_hex)]
    pkey: u32,
    #[arg(long)]
    count: usize,
}

fn parse_hex(s: &str) -> Result<u32, std::num::ParseIntError> {
    u32::from_str_radix(s.trim_start_matches("0x"), 16)
}

fn main() {
    let a = Args::parse();
    let bound = inc_socket::bind(a.ip, &[comm_key(a.comm), host_key(a.pkey as u16)])
        .expect("bind the INC socket");
    assert!(bound.share.is_some(), "the socket must share its address");
    println!("bound");
    let _ = std::io::stdout().flush();
    let sock = bound.sock;
    let mut buf = [0u8; 2048];
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    for _ in 0..a.count {
        let n = sock.recv(&mut buf).expect("a datagram within 10 s");
        println!("{}", innet_lab::hex(&buf[..n]));
    }
    sock.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    if sock.recv(&mut buf).is_ok() {
        println!("extra");
    }
}
