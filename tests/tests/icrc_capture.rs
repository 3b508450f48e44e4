//! Every INC frame on the wire carries a valid ICRC (issue 33, item 5): frames captured in
//! every host's and every TOR's namespace (and every DPU's) during real allreduces in
//! `inc-node`, `inc-socket`, `host-rd`, `inc-nic` and `inc-dpu`, each ICRC checked by a
//! CRC-32 written here over the masked bytes (not the library's). Counted apart: frames
//! a host's kernel sent (its INC socket: the kernel picked the IPv4 id the ICRC covers),
//! results the network delivered to hosts (switch, NIC or DPU made; SE bit set), and
//! frames NICs and DPUs sent onto the fabric (seen arriving at their TOR). A plain socket
//! without `IP_PMTUDISC_DO` (what the INC sockets were before) is caught sending bad ones.

use std::{collections::BTreeMap, net::UdpSocket};

use innet_client::{
    Layout, Mode,
    frames::{self, DataId},
};
use innet_common::{
    proto::{BTH_FLAG_RESULT, Dtype, JUMBO_MTU, MAX_PAYLOAD_BYTES, Op, ROCEV2_UDP_PORT},
    wire::ETH_LEN,
};
use innet_lab::{
    NetNs,
    daemons::{daemons_on, dpu_fabric, learn_hosts, nic_daemons_on},
    job::{checked_allreduce, run_job},
    topology::{Options, Shape, Topology},
};
use innet_tools::capture::{Capture, Captured};

/// The ICRC as IBA annex A17 defines it for RoCEv2, from the frame's own bytes: CRC-32
/// over 8 bytes of 0xff, the IPv4 header with TOS, TTL and checksum as ones, the UDP header
/// with its checksum as ones, the BTH with `resv8a` as ones, and the rest up to the last
/// four bytes of the IPv4 packet, which hold it little-endian.
fn icrc_valid(f: &[u8]) -> bool {
    let ip = ETH_LEN;
    let ihl = usize::from(f[ip] & 0x0f) * 4;
    // Past the IPv4 total length is Ethernet padding.
    let end = ip + usize::from(u16::from_be_bytes([f[ip + 2], f[ip + 3]]));
    let mut covered = vec![0xffu8; 8];
    covered.extend_from_slice(&f[ip..end - 4]);
    let (ip, udp) = (8, 8 + ihl);
    for i in [
        ip + 1,
        ip + 8,
        ip + 10,
        ip + 11,
        udp + 6,
        udp + 7,
        udp + 8 + 4,
    ] {
        covered[i] = 0xff;
    }
    let carried = u32::from_le_bytes(f[end - 4..end].try_into().expect("4 bytes"));
    crc32fast::hash(&covered) == carried
}

fn se_bit(f: &[u8]) -> bool {
    let bth = ETH_LEN + usize::from(f[ETH_LEN] & 0x0f) * 4 + 8;
    f[bth + 1] & BTH_FLAG_RESULT != 0
}

/// Where a frame was seen: what made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Seen {
    /// Leaving a host: its kernel wrote the IPv4 header.
    HostSent,
    /// Arriving at a host with the SE bit: a result a switch, NIC or DPU made.
    DeliveredResult,
    /// Arriving at a host without it: another host's frame, or a switch's control answer.
    HostReceived,
    /// Arriving at a TOR from a host port (NIC and DPU frames, host frames the TOR passed).
    TorFromHost,
    /// Leaving a TOR, or arriving on its uplinks.
    TorOther,
    /// Crossing a DPU's ports or bridge.
    Dpu,
}

/// Frames checked in each place, and the invalid ones.
#[derive(Default)]
struct Tally {
    checked: BTreeMap<Seen, usize>,
    /// The longest frame seen in each place.
    longest: BTreeMap<Seen, usize>,
    invalid: Vec<(Seen, Captured)>,
}

impl Tally {
    fn add(&mut self, seen: Seen, frames: Vec<Captured>) {
        for c in frames {
            *self.checked.entry(seen_as(seen, &c)).or_default() += 1;
            let longest = self.longest.entry(seen_as(seen, &c)).or_default();
            *longest = (*longest).max(c.frame.len());
            if !icrc_valid(&c.frame) {
                self.invalid.push((seen_as(seen, &c), c));
            }
        }
    }

    fn get(&self, seen: Seen) -> usize {
        self.checked.get(&seen).copied().unwrap_or(0)
    }

    fn longest(&self, seen: Seen) -> usize {
        self.longest.get(&seen).copied().unwrap_or(0)
    }
}

/// Refines a vantage point (`HostSent` for hosts, `TorOther` for TORs, `Dpu`) by the
/// frame's direction and bits.
fn seen_as(vantage: Seen, c: &Captured) -> Seen {
    match vantage {
        Seen::HostSent if c.outgoing => Seen::HostSent,
        Seen::HostSent if se_bit(&c.frame) => Seen::DeliveredResult,
        Seen::HostSent => Seen::HostReceived,
        other => other,
    }
}

/// Captures every host's, TOR's and DPU's INC frames while `job` runs; tallies them.
fn captured(topo: &Topology, job: impl FnOnce()) -> Tally {
    let host_ports: Vec<Vec<u32>> = topo
        .tors
        .iter()
        .enumerate()
        .map(|(t, _)| topo.hosts_of(t).map(|(_, h)| h.tor_port).collect())
        .collect();
    let start = |ns: &NetNs| Capture::start(ns);
    let hosts: Vec<Capture> = topo.hosts.iter().map(|h| start(&h.ns)).collect();
    let tors: Vec<Capture> = topo.tors.iter().map(|t| start(&t.ns)).collect();
    let dpus: Vec<Capture> = topo
        .hosts
        .iter()
        .filter_map(|h| h.dpu.as_ref().map(|d| start(&d.ns)))
        .collect();
    job();
    let mut tally = Tally::default();
    for c in hosts {
        tally.add(Seen::HostSent, c.finish());
    }
    for (t, c) in tors.into_iter().enumerate() {
        let (from_hosts, other): (Vec<_>, Vec<_>) = c
            .finish()
            .into_iter()
            .partition(|c| !c.outgoing && host_ports[t].contains(&c.ifindex));
        tally.add(Seen::TorFromHost, from_hosts);
        tally.add(Seen::TorOther, other);
    }
    for c in dpus {
        tally.add(Seen::Dpu, c.finish());
    }
    tally
}

/// A few checked allreduces: integers and floats, one element to several packets.
fn some_allreduces(topo: &Topology, layout: Layout, mode: Mode) {
    let cases = [
        (Op::Sum, Dtype::I32, 1),
        (Op::Sum, Dtype::I32, 1000),
        (Op::Max, Dtype::U16, 300),
        (Op::Sum, Dtype::F64, 400),
        (Op::Minloc, Dtype::I32, 50),
    ];
    checked_cases(topo, layout, mode, &cases);
}

/// Checked allreduces of `cases` (op, type, count), with UDP GRO off.
fn checked_cases(topo: &Topology, layout: Layout, mode: Mode, cases: &[(Op, Dtype, usize)]) {
    run_job(
        topo,
        layout,
        mode,
        // UDP GRO would hand the capture trains of datagrams glued together in the host,
        // which never were on the wire: every frame checked here is one the wire carried.
        |cfg| cfg.gro = false,
        |comm| {
            for (case, &(op, dtype, count)) in cases.iter().enumerate() {
                checked_allreduce(comm, case, op, dtype, count);
            }
        },
    );
}

fn assert_all_valid(mode: Mode, tally: &Tally) {
    eprintln!("{mode}: frames checked {:?}", tally.checked);
    if let Some((seen, c)) = tally.invalid.first() {
        panic!(
            "{mode}: {} of {} frames carry a bad ICRC; the first ({seen:?}, ifindex {}): {}",
            tally.invalid.len(),
            tally.checked.values().sum::<usize>(),
            c.ifindex,
            innet_lab::hex(&c.frame)
        );
    }
}

#[test]
fn every_frame_of_switch_socket_host_and_nic_jobs_has_a_valid_icrc() {
    // 2 TORs × 2 nodes × 2 sockets under a SPINE: innet switches, NIC daemons on each
    // node's first port.
    let topo = Topology::new(Shape::small().with_sockets(2));
    learn_hosts(&topo);
    let _switches = daemons_on(&topo, &[]);
    let _nics = nic_daemons_on(&topo, &[]);
    let layout = Layout::new(8, 2, 2).expect("layout");
    for mode in [Mode::IncNode, Mode::IncSocket, Mode::HostRd] {
        let tally = captured(&topo, || some_allreduces(&topo, layout, mode));
        assert_all_valid(mode, &tally);
        assert!(tally.get(Seen::HostSent) > 0, "{mode}: no host frame");
        if mode != Mode::HostRd {
            assert!(tally.get(Seen::DeliveredResult) > 0, "{mode}: no result");
        }
    }
    let nic_layout = Layout::new(4, 1, 1).expect("layout");
    let tally = captured(&topo, || some_allreduces(&topo, nic_layout, Mode::IncNic));
    assert_all_valid(Mode::IncNic, &tally);
    // The hosts send the handshake; the NICs the partials and the root's results.
    assert!(tally.get(Seen::HostSent) > 0);
    assert!(tally.get(Seen::TorFromHost) > 0);
}

/// Jumbo links (issue 35): 8 KiB results span several XDP buffers and are fanned out on
/// tc, at the SPINE with the CRC of the payload it reduced, at each TOR from the ICRC the
/// SPINE's copy came with (no pass over the payload). Every frame still carries a valid
/// ICRC, the long results at the TORs' uplinks and at the hosts included.
#[test]
fn every_frame_of_a_jumbo_job_has_a_valid_icrc() {
    // 2 TORs × 2 nodes under a SPINE, every link 9000 B.
    let topo = Topology::with(
        Shape::small(),
        Options {
            innet: true,
            mtu: Some(JUMBO_MTU),
            ..Options::default()
        },
    );
    learn_hosts(&topo);
    let _switches = daemons_on(&topo, &[]);
    let layout = Layout::new(8, 2, 1).expect("layout");
    // Several full 8 KiB packets and a partial one, integers and floats.
    let count = |dtype: Dtype| (3 * MAX_PAYLOAD_BYTES + 200) / dtype.width();
    let cases = [
        (Op::Sum, Dtype::F64, count(Dtype::F64)),
        (Op::Sum, Dtype::I32, count(Dtype::I32)),
        (Op::Max, Dtype::U16, count(Dtype::U16)),
    ];
    let tally = captured(&topo, || {
        checked_cases(&topo, layout, Mode::IncNode, &cases);
    });
    assert_all_valid(Mode::IncNode, &tally);
    let long = MAX_PAYLOAD_BYTES;
    assert!(
        tally.longest(Seen::DeliveredResult) > long,
        "no 8 KiB result reached a host: {:?}",
        tally.longest
    );
    assert!(
        tally.longest(Seen::TorOther) > long,
        "no 8 KiB frame crossed a TOR's uplink: {:?}",
        tally.longest
    );
}

#[test]
fn every_frame_of_a_dpu_job_has_a_valid_icrc() {
    let (topo, _dpus) = dpu_fabric();
    let layout = Layout::new(4, 1, 1).expect("layout");
    let tally = captured(&topo, || some_allreduces(&topo, layout, Mode::IncDpu));
    assert_all_valid(Mode::IncDpu, &tally);
    // Hosts send contributions, DPUs hand them results and send partials and multicasts.
    assert!(tally.get(Seen::HostSent) > 0);
    assert!(tally.get(Seen::DeliveredResult) > 0);
    assert!(tally.get(Seen::TorFromHost) > 0);
}

/// The check catches what the INC sockets did before: a socket under the kernel's default
/// `IP_PMTUDISC_WANT` gets an IPv4 id drawn per destination, which the ICRC does not expect.
#[test]
fn a_socket_without_pmtu_discovery_sends_bad_icrcs() {
    let topo = Topology::plain(Shape::one_level(2));
    learn_hosts(&topo);
    let (a, b) = (&topo.hosts[0], &topo.hosts[1]);
    let capture = Capture::start(&a.ns);
    a.ns.run(|| {
        let sock = UdpSocket::bind((a.ip, ROCEV2_UDP_PORT)).expect("bind");
        for k in 0..20u8 {
            let addr = frames::addressing(a.ip, b.ip, u32::from(k), 1);
            let id = DataId {
                src_rank: 0,
                op: Op::Sum,
                dtype: Dtype::I32,
                req_id: k,
                pkt_index: 0,
            };
            let payload = frames::data(&addr, 0x42, id, &[0, 0, 0, k]);
            sock.send_to(&payload, (b.ip, ROCEV2_UDP_PORT))
                .expect("send");
        }
    });
    let sent: Vec<_> = capture
        .finish()
        .into_iter()
        .filter(|c| c.outgoing)
        .collect();
    assert_eq!(sent.len(), 20);
    let bad = sent.iter().filter(|c| !icrc_valid(&c.frame)).count();
    eprintln!(
        "plain socket: {bad} of {} frames with a bad ICRC",
        sent.len()
    );
    // An id drawn at random is 0 one time in 65536.
    assert!(bad >= 19, "{bad} of 20");
}
