//! The XDP classifier through BPF_PROG_TEST_RUN: every frame class, every malformation,
//! every truncation and random mutations are compared with the userspace model
//! (`codec::classify`); every frame must pass (`XDP_PASS`) byte for byte unchanged.

use aya::{
    Ebpf,
    programs::{TestRun as _, TestRunOptions, Xdp},
};
use innet::loader::load_object;
use innet_common::{
    codec::{
        Addressing, Class, classify, control_header, data_header, encode, encode_control,
        encode_elements,
    },
    maps::{PROG_NIC, PROG_SWITCH},
    proto::{Dtype, MAX_PAYLOAD_BYTES, Op, PacketKind, element_bytes},
    stats::PortStats,
    validate::Malformed,
    wire::{
        ControlPayload, ETH_LEN, HANDOFF_HEADERS_LEN, HANDOFF_MAC_PREFIX, IPV4_LEN, PAYLOAD_OFFSET,
        UDP_LEN, handoff_flags,
    },
};
use innet_lab::{Rng, bpf::port_totals, require_root};

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;

struct Harness {
    ebpf: Ebpf,
    /// The program under test: the switch port's, or the NIC port's.
    program: &'static str,
}

impl Harness {
    fn new() -> Self {
        Self::of(PROG_SWITCH)
    }

    fn of(program: &'static str) -> Self {
        require_root();
        let mut ebpf = load_object().expect("parse the embedded object");
        let prog: &mut Xdp = ebpf
            .program_mut(program)
            .expect("program")
            .try_into()
            .expect("xdp");
        prog.load().expect("verifier accepts the program");
        Self { ebpf, program }
    }

    fn totals(&self) -> PortStats {
        port_totals(&self.ebpf)
    }

    /// Runs one frame; asserts XDP_DROP for what is malformed (passed on, it could reach a
    /// member unchecked) and XDP_PASS with the frame unchanged for everything else;
    /// returns the class the counters recorded.
    fn run(&self, frame: &[u8]) -> Class {
        let prog: &Xdp = self
            .ebpf
            .program(self.program)
            .expect("program")
            .try_into()
            .expect("xdp");
        let before = self.totals();
        let mut out = vec![0u8; frame.len() + 256];
        let result = prog
            .test_run(TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                ..TestRunOptions::new()
            })
            .unwrap_or_else(|e| panic!("test_run of a {}-byte frame: {e}", frame.len()));
        let after = self.totals();
        let class = delta_class(&before, &after, result.return_value);
        if let Class::Malformed(_) = class {
            assert_eq!(
                result.return_value, XDP_DROP,
                "malformed frames are dropped"
            );
        } else if after.later_fragments_dropped > before.later_fragments_dropped {
            assert_eq!(
                (class, result.return_value),
                (Class::NonRoce, XDP_DROP),
                "the rest of a datagram whose first fragment was dropped is dropped"
            );
        } else {
            assert_eq!(result.return_value, XDP_PASS, "every other frame passes");
            assert_eq!(
                &out[..result.data_size_out as usize],
                frame,
                "the frame leaves untouched"
            );
        }
        class
    }
}

/// Which class counter moved by exactly one (and that nothing else is off).
fn delta_class(before: &PortStats, after: &PortStats, verdict: u32) -> Class {
    let d = |f: fn(&PortStats) -> u64| f(after) - f(before);
    assert_eq!(d(|s| s.rx_packets), 1);
    let verdict_counter = if verdict == XDP_DROP {
        d(|s| s.xdp_drop)
    } else {
        d(|s| s.xdp_pass)
    };
    assert_eq!(verdict_counter, 1, "the verdict is counted");
    let mut hits = vec![];
    if d(|s| s.non_roce) == 1 {
        hits.push(Class::NonRoce);
    }
    if d(|s| s.roce_other) == 1 {
        hits.push(Class::RoceOther);
    }
    if d(|s| s.inc_data) == 1 {
        hits.push(Class::IncData);
    }
    if d(|s| s.inc_control) == 1 {
        hits.push(Class::IncControl);
    }
    if d(|s| s.malformed) == 1 {
        let mut a = *after;
        let mut b = *before;
        for reason in Malformed::ALL {
            if *a.reason_mut(reason) - *b.reason_mut(reason) == 1 {
                hits.push(Class::Malformed(reason));
            }
        }
    }
    assert_eq!(
        hits.len(),
        1,
        "exactly one class counter per frame, got {hits:?}"
    );
    hits[0]
}

fn data(op: Op, dtype: Dtype, n: usize) -> Vec<u8> {
    let values: Vec<i64> = (0..n as i64).map(|i| i * 37 - 5).collect();
    let locs: Vec<i32> = (0..n as i32).collect();
    let body = encode_elements(dtype, &values, op.carries_location().then_some(&locs[..]));
    encode(
        &Addressing::default(),
        &data_header(0x42, 3, op, dtype, 1, 0, n as u16),
        &body,
    )
}

fn control(kind: PacketKind) -> Vec<u8> {
    let mut p = ControlPayload::default();
    p.set_true_comm_id(0x42);
    encode_control(&Addressing::default(), kind, 0, &p)
}

#[test]
fn each_valid_kind_is_counted() {
    let h = Harness::new();
    for op in Op::ALL {
        for dtype in Dtype::ALL {
            let max = MAX_PAYLOAD_BYTES / element_bytes(op, dtype);
            for n in [1, 3, max] {
                assert_eq!(
                    h.run(&data(op, dtype, n)),
                    Class::IncData,
                    "{op:?} {dtype:?} ×{n}"
                );
            }
        }
    }
    for kind in [PacketKind::Query, PacketKind::Notify, PacketKind::Kill] {
        assert_eq!(h.run(&control(kind)), Class::IncControl, "{kind:?}");
    }
}

#[test]
fn foreign_frames_pass_as_non_roce_or_other_roce() {
    let h = Harness::new();
    let base = data(Op::Sum, Dtype::I32, 4);
    let mutate = |at: usize, bytes: &[u8]| {
        let mut f = base.clone();
        f[at..at + bytes.len()].copy_from_slice(bytes);
        f
    };
    let cases = [
        (mutate(12, &[0x08, 0x06]), Class::NonRoce), // ARP
        (mutate(12, &[0x86, 0xdd]), Class::NonRoce), // IPv6
        (mutate(ETH_LEN, &[0x65]), Class::NonRoce),  // IPv4 version 6
        (mutate(ETH_LEN, &[0x44]), Class::NonRoce),  // IHL 4
        (mutate(ETH_LEN + 9, &[6]), Class::NonRoce), // TCP
        (mutate(ETH_LEN + 9, &[1]), Class::NonRoce), // ICMP
        (mutate(ETH_LEN + 6, &[0x00, 0x10]), Class::NonRoce), // later fragment
        (
            mutate(ETH_LEN + IPV4_LEN + 2, &[0x12, 0xb8]),
            Class::NonRoce,
        ), // UDP 4792
        (
            mutate(ETH_LEN + IPV4_LEN + UDP_LEN, &[0x04]),
            Class::RoceOther,
        ), // RC SEND Only
        (mutate(PAYLOAD_OFFSET - 22, b"XNC1"), Class::RoceOther), // no INC tag
    ];
    for (i, (frame, class)) in cases.iter().enumerate() {
        assert_eq!(classify(frame), *class, "model, case {i}");
        assert_eq!(h.run(frame), *class, "xdp, case {i}");
    }
}

#[test]
fn each_malformation_is_counted_by_reason() {
    let h = Harness::new();
    let with = |f: &dyn Fn(&mut innet_common::wire::IncHeader), body: &[u8]| {
        let mut hdr = data_header(9, 0, Op::Max, Dtype::U16, 0, 0, (body.len() / 2) as u16);
        f(&mut hdr);
        encode(&Addressing::default(), &hdr, body)
    };
    let body = [0u8; 8];
    let mut bad_ip_len = data(Op::Sum, Dtype::I32, 2);
    bad_ip_len[ETH_LEN + 3] += 8;
    let cases: Vec<(Vec<u8>, Malformed)> = vec![
        (with(&|h| h.tag_high = [1; 4], &body), Malformed::BadTag),
        (with(&|h| h.data_flag = 200, &body), Malformed::BadKind),
        (with(&|h| h.comm_id = 0xff, &body), Malformed::BadKind),
        (
            encode(
                &Addressing::default(),
                &{
                    let mut c = control_header(PacketKind::Kill, 0);
                    c.comm_id = 1;
                    c
                },
                &[0; innet_common::wire::CONTROL_LEN],
            ),
            Malformed::BadKind,
        ),
        (with(&|h| h.op_code = 99, &body), Malformed::BadOp),
        (with(&|h| h.oper_and_type = 99, &body), Malformed::BadType),
        (
            with(&|h| h.pkt_para_num = [0, 3], &body),
            Malformed::BadCount,
        ),
        (with(&|h| h.pkt_para_num = [0, 0], &[]), Malformed::BadCount),
        (
            with(
                &|h| h.pkt_para_num = (MAX_PAYLOAD_BYTES as u16 / 2 + 2).to_be_bytes(),
                &[0; MAX_PAYLOAD_BYTES + 4],
            ),
            Malformed::TooLarge,
        ),
        (
            encode(
                &Addressing::default(),
                &control_header(PacketKind::Query, 0),
                &[0; 55],
            ),
            Malformed::BadControl,
        ),
        (bad_ip_len, Malformed::BadLength),
    ];
    for (i, (frame, reason)) in cases.iter().enumerate() {
        assert_eq!(
            classify(frame),
            Class::Malformed(*reason),
            "model, case {i}"
        );
        assert_eq!(h.run(frame), Class::Malformed(*reason), "xdp, case {i}");
    }
}

#[test]
fn every_truncation_matches_the_model() {
    let h = Harness::new();
    for frame in [data(Op::Minloc, Dtype::I64, 5), control(PacketKind::Notify)] {
        // BPF_PROG_TEST_RUN refuses XDP input shorter than an Ethernet header.
        for len in ETH_LEN..frame.len() {
            let prefix = &frame[..len];
            assert_eq!(h.run(prefix), classify(prefix), "prefix of {len} bytes");
        }
    }
}

#[test]
fn random_mutations_match_the_model() {
    let h = Harness::new();
    let seeds = [
        data(Op::Sum, Dtype::U32, 8),
        data(Op::Maxloc, Dtype::I8, 3),
        control(PacketKind::Query),
    ];
    let mut rng = Rng(0x1cc0_ffee_1234_5678);
    for i in 0..1500 {
        let mut f = seeds[i % seeds.len()].clone();
        for _ in 0..=rng.below(3) {
            // Bias mutations towards the headers, where the decisions are made.
            let at = if rng.below(4) == 0 {
                rng.below(f.len())
            } else {
                rng.below(PAYLOAD_OFFSET.min(f.len()))
            };
            f[at] = rng.next_u64() as u8;
        }
        if rng.below(5) == 0 {
            f.truncate(ETH_LEN + rng.below(f.len() - ETH_LEN));
        }
        assert_eq!(h.run(&f), classify(&f), "mutation {i}: {f:02x?}");
    }
}

/// `frame` with `tags` VLAN tags (802.1Q, VLAN 0: a host's kernel takes it as untagged).
fn tagged(frame: &[u8], tags: usize) -> Vec<u8> {
    let mut f = frame.to_vec();
    for _ in 0..tags {
        f.splice(12..12, [0x81, 0x00, 0x00, 0x00]);
    }
    f
}

/// `frame` with `words` 32-bit words of IPv4 options (NOPs), lengths kept consistent.
fn with_options(frame: &[u8], words: usize) -> Vec<u8> {
    let mut f = frame.to_vec();
    f.splice(ETH_LEN + IPV4_LEN..ETH_LEN + IPV4_LEN, vec![1u8; 4 * words]);
    f[ETH_LEN] = 0x45 + words as u8;
    let total = u16::from_be_bytes([f[ETH_LEN + 2], f[ETH_LEN + 3]]) + 4 * words as u16;
    f[ETH_LEN + 2..ETH_LEN + 4].copy_from_slice(&total.to_be_bytes());
    f
}

/// The attacks of issue 44 item 1: an INC packet the data path cannot read at its fixed
/// offsets, or a fragment of one, is dropped and counted, never passed to a member; other
/// RoCEv2 and UDP in those layouts still pass untouched.
#[test]
fn inc_in_other_layouts_and_fragments_are_dropped() {
    let h = Harness::new();
    let inc = data(Op::Sum, Dtype::I32, 4);
    let query = control(PacketKind::Query);
    let mut other_roce = inc.clone();
    other_roce[ETH_LEN + IPV4_LEN + UDP_LEN] = 0x04; // RC SEND Only
    let mut other_udp = inc.clone();
    other_udp[ETH_LEN + IPV4_LEN + 2..ETH_LEN + IPV4_LEN + 4].copy_from_slice(&[0x12, 0xb8]);
    let frag = |f: &[u8], bits: u16| {
        let mut f = f.to_vec();
        f[ETH_LEN + 6..ETH_LEN + 8].copy_from_slice(&bits.to_be_bytes());
        f
    };
    let mut tiny_first = frag(&other_udp, 0x2000);
    tiny_first[ETH_LEN + 2..ETH_LEN + 4].copy_from_slice(&(IPV4_LEN as u16 + 4).to_be_bytes());
    let layout = Class::Malformed(Malformed::Layout);
    let fragment = Class::Malformed(Malformed::Fragment);
    let cases = [
        (tagged(&inc, 1), layout),
        (tagged(&inc, 2), layout),
        (tagged(&query, 1), layout),
        (tagged(&inc, 5), layout), // deeper than the classifier looks
        (with_options(&inc, 1), layout),
        (with_options(&inc, 10), layout),
        (with_options(&query, 1), layout),
        (tagged(&with_options(&inc, 2), 1), layout),
        (frag(&inc, 0x2000), fragment), // first fragment, MF set
        (frag(&inc, 0x4000 | 0x2000), fragment), // DF and MF
        (tagged(&frag(&inc, 0x2000), 1), fragment),
        (tiny_first, fragment),
        (frag(&inc, 0x0001), Class::NonRoce), // a later fragment: no ports to read
        (frag(&other_udp, 0x2000), Class::NonRoce),
        (tagged(&other_roce, 1), Class::RoceOther),
        (with_options(&other_roce, 3), Class::RoceOther),
        (tagged(&other_udp, 2), Class::NonRoce),
        (with_options(&other_udp, 3), Class::NonRoce),
        (tagged(&inc, 4), layout),
    ];
    for (i, (frame, class)) in cases.iter().enumerate() {
        assert_eq!(classify(frame), *class, "model, case {i}");
        assert_eq!(h.run(frame), *class, "xdp, case {i}");
    }
}

/// The switch marks a result it passes to its tc fan-out with the hand-off MAC: an INC
/// packet from the wire addressed to it is dropped (`mal_handoff`), or the tc program
/// would fan it out to every child unchecked. Other traffic to that address passes, and
/// the fan-out's own test for the mark says no to it.
#[test]
fn inc_addressed_to_the_handoff_mac_is_dropped() {
    let h = Harness::new();
    let to_handoff = |f: &[u8], flags: u8| {
        let mut f = f.to_vec();
        f[..5].copy_from_slice(&HANDOFF_MAC_PREFIX);
        f[5] = flags;
        f
    };
    let inc = data(Op::Sum, Dtype::I32, 4);
    let mut other_roce = inc.clone();
    other_roce[ETH_LEN + IPV4_LEN + UDP_LEN] = 0x04; // RC SEND Only
    let mut other_udp = inc.clone();
    other_udp[ETH_LEN + IPV4_LEN + 2..ETH_LEN + IPV4_LEN + 4].copy_from_slice(&[0x12, 0xb8]);
    let handoff = Class::Malformed(Malformed::Handoff);
    let cases = [
        (to_handoff(&inc, 0), handoff, Some(0)),
        (to_handoff(&inc, 3), handoff, Some(3)),
        (to_handoff(&control(PacketKind::Query), 1), handoff, Some(1)),
        (
            to_handoff(&tagged(&inc, 1), 1),
            Class::Malformed(Malformed::Layout),
            None,
        ),
        (to_handoff(&other_roce, 1), Class::RoceOther, None),
        (to_handoff(&other_udp, 1), Class::NonRoce, None),
        (inc.clone(), Class::IncData, None),
    ];
    for (i, (frame, class, flags)) in cases.iter().enumerate() {
        assert_eq!(classify(frame), *class, "model, case {i}");
        assert_eq!(h.run(frame), *class, "xdp, case {i}");
        let head: [u8; HANDOFF_HEADERS_LEN] = frame[..HANDOFF_HEADERS_LEN].try_into().unwrap();
        assert_eq!(
            handoff_flags(&head, frame.len()),
            *flags,
            "fan-out's test, case {i}"
        );
    }
}

/// A forged INC packet in fragments: its first fragment is dropped (`mal_fragment`), and so
/// are its later ones (which carry no UDP header), so that no member's kernel queues them
/// for reassembly; a later fragment of another datagram passes, and a first fragment that
/// passes (another datagram under the same id) lets its later fragments pass again.
#[test]
fn the_rest_of_a_dropped_fragmented_datagram_is_dropped_too() {
    // A switch port, and a NIC's port in front of its host (a DPU's uplink).
    for program in [PROG_SWITCH, PROG_NIC] {
        rest_of_dropped_datagram_dropped(&Harness::of(program));
    }
}

fn rest_of_dropped_datagram_dropped(h: &Harness) {
    let inc = data(Op::Sum, Dtype::I32, 4);
    let mut other_udp = inc.clone();
    other_udp[ETH_LEN + IPV4_LEN + 2..ETH_LEN + IPV4_LEN + 4].copy_from_slice(&[0x12, 0xb8]);
    let frag = |f: &[u8], id: u16, bits: u16| {
        let mut f = f.to_vec();
        f[ETH_LEN + 4..ETH_LEN + 6].copy_from_slice(&id.to_be_bytes());
        f[ETH_LEN + 6..ETH_LEN + 8].copy_from_slice(&bits.to_be_bytes());
        f
    };
    let verdict = |f: &[u8]| {
        let before = h.totals();
        let class = h.run(f);
        (class, h.totals().since(&before).later_fragments_dropped)
    };
    let (fragment, non_roce) = (Class::Malformed(Malformed::Fragment), Class::NonRoce);
    // In order: each case sees what the ones before it left in the switch's memory.
    let cases = [
        (frag(&inc, 7, 0x2000), (fragment, 0), "first fragment"),
        (
            frag(&inc, 7, 0x2001),
            (non_roce, 1),
            "a middle fragment of it",
        ),
        (frag(&inc, 7, 0x0002), (non_roce, 1), "its last fragment"),
        (
            tagged(&frag(&inc, 7, 0x0003), 1),
            (non_roce, 1),
            "behind a VLAN tag too",
        ),
        (
            frag(&inc, 8, 0x0001),
            (non_roce, 0),
            "another datagram's fragment passes",
        ),
        // Another datagram under id 7 whose first fragment passes: its rest passes too.
        (
            frag(&other_udp, 7, 0x2000),
            (non_roce, 0),
            "another first fragment, id 7",
        ),
        (
            frag(&other_udp, 7, 0x0001),
            (non_roce, 0),
            "a passing first fragment clears its datagram",
        ),
    ];
    for (frame, want, what) in &cases {
        assert_eq!(verdict(frame), *want, "{}: {what}", h.program);
    }
}
