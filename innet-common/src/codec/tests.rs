use super::*;
use crate::proto::MAX_PAYLOAD_BYTES;
use crate::validate::{Malformed, Verdict};
use crate::wire::{IPV4_LEN, PAYLOAD_OFFSET, UDP_LEN};
use std::{vec, vec::Vec};

fn sample_data() -> Vec<u8> {
    let body = encode_elements(Dtype::I32, &[1, -2, 3], None);
    encode(
        &Addressing::default(),
        &data_header(0x12_3456, 7, Op::Sum, Dtype::I32, 9, 0, 3),
        &body,
    )
}

fn sample_control() -> (Vec<u8>, ControlPayload) {
    let mut p = ControlPayload::default();
    p.set_true_comm_id(0xdead_beef);
    p.set_job_id(0x0102_0304_0506_0708);
    p.set_ava_grp_num(77);
    p.query_notify_hop = 3;
    (
        encode_control(&Addressing::default(), PacketKind::Query, 5, &p),
        p,
    )
}

#[test]
fn data_round_trip() {
    let frame = sample_data();
    let p = parse(&frame).expect("valid frame");
    assert_eq!(
        p.verdict,
        Verdict::Data {
            op: Op::Sum,
            dtype: Dtype::I32,
            count: 3
        }
    );
    assert_eq!(p.inc.group(), 0x12_3456);
    assert_eq!(p.inc.src_rank(), 7);
    assert_eq!(p.inc.req_id, 9);
    assert_eq!(p.body, &[0, 0, 0, 1, 0xff, 0xff, 0xff, 0xfe, 0, 0, 0, 3]);
    assert_eq!(p.addr, Addressing::default());
    assert_eq!(p.bth.pad_count(), 2, "22 + 12 bytes pad to 36");
    assert_eq!(frame.len(), PAYLOAD_OFFSET + 12 + 2 + ICRC_LEN);
    assert_eq!(classify(&frame), Class::IncData);
}

#[test]
fn control_round_trip() {
    let (frame, payload) = sample_control();
    let p = parse(&frame).expect("valid frame");
    assert_eq!(p.verdict, Verdict::Control(PacketKind::Query));
    assert_eq!(p.control(), Some(payload));
    assert_eq!(p.control().unwrap().job_id(), 0x0102_0304_0506_0708);
    assert!(p.inc.is_control_comm());
    assert_eq!(classify(&frame), Class::IncControl);
}

/// The exact bytes of a data frame, written out by hand from the layout in wire.rs.
#[test]
fn golden_bytes() {
    let frame = sample_data();
    #[rustfmt::skip]
    let expected_headers: &[u8] = &[
        // Ethernet
        0x02, 0, 0, 0, 0, 2,  0x02, 0, 0, 0, 0, 1,  0x08, 0x00,
        // IPv4: len 20+8+12+8+22+12+2+4 = 88, DF, TTL 64, UDP, checksum, 10.0.0.1 → 10.0.0.2
        0x45, 0x00, 0x00, 88, 0x00, 0x00, 0x40, 0x00, 64, 17, 0x26, 0x93, 10, 0, 0, 1, 10, 0, 0, 2,
        // UDP: 49152 → 4791, len 68, checksum 0
        0xc0, 0x00, 0x12, 0xb7, 0x00, 68, 0x00, 0x00,
        // BTH: UD SEND Only, pad 2, P_Key ffff, dest QP 0x1cc1, PSN 0
        0x64, 0x20, 0xff, 0xff, 0x00, 0x00, 0x1c, 0xc1, 0x00, 0x00, 0x00, 0x00,
        // DETH: Q_Key, source QP
        0x1c, 0xc0, 0xff, 0xee, 0x00, 0x00, 0x1c, 0xc1,
        // INC: "INC1", rank 7, data, comm_id 0x56, hi 0x1234, sum, int32, req 9, pkt 0, count 3, "MPIr"
        0x49, 0x4e, 0x43, 0x31, 0, 0, 0, 7, 0x00, 0x56, 0x12, 0x34, 0x00, 0x02, 9, 0, 0x00, 0x03,
        0x4d, 0x50, 0x49, 0x72,
    ];
    assert_eq!(&frame[..PAYLOAD_OFFSET], expected_headers);
    assert_eq!(
        ipv4_checksum(&frame[ETH_LEN..ETH_LEN + IPV4_LEN]),
        0,
        "checksum verifies"
    );
    assert_eq!(
        &frame[PAYLOAD_OFFSET + 12..PAYLOAD_OFFSET + 14],
        &[0, 0],
        "pad bytes"
    );
}

/// CRC-32 over the masked pseudo-header, computed here independently of `icrc::compute`.
#[test]
fn icrc_matches_an_independent_computation() {
    let frame = sample_data();
    let mut masked = vec![0xffu8; 8];
    masked.extend_from_slice(&frame[ETH_LEN..frame.len() - ICRC_LEN]);
    let ip = 8;
    masked[ip + 1] = 0xff;
    masked[ip + 8] = 0xff;
    masked[ip + 10] = 0xff;
    masked[ip + 11] = 0xff;
    let udp = ip + IPV4_LEN;
    masked[udp + 6] = 0xff;
    masked[udp + 7] = 0xff;
    masked[udp + UDP_LEN + 4] = 0xff;
    let crc = crc32fast::hash(&masked);
    assert_eq!(&frame[frame.len() - 4..], &crc.to_le_bytes());
}

#[test]
fn icrc_ignores_the_masked_fields_and_covers_the_rest() {
    let frame = sample_data();
    let mut hop = frame.clone();
    hop[ETH_LEN + 8] -= 1; // TTL, as a router changes it
    hop[ETH_LEN + 1] = 0xb8; // DSCP
    let csum = {
        hop[ETH_LEN + 10] = 0;
        hop[ETH_LEN + 11] = 0;
        ipv4_checksum(&hop[ETH_LEN..ETH_LEN + IPV4_LEN])
    };
    hop[ETH_LEN + 10..ETH_LEN + 12].copy_from_slice(&csum.to_be_bytes());
    parse(&hop).expect("TTL, TOS and IP checksum are outside the ICRC");

    let mut flipped = frame;
    let last_payload = flipped.len() - ICRC_LEN - 3;
    flipped[last_payload] ^= 1;
    assert!(matches!(parse(&flipped), Err(ParseError::BadIcrc { .. })));
}

#[test]
fn every_truncation_is_rejected_with_its_layer() {
    for frame in [sample_data(), sample_control().0] {
        for len in 0..frame.len() {
            let err = parse(&frame[..len]).expect_err("a truncated frame must not parse");
            let ParseError::Truncated { layer, need, have } = err else {
                panic!("prefix of {len} bytes: expected Truncated, got {err:?}");
            };
            assert_eq!(have, len);
            assert!(need > len, "{layer:?}");
            let expected = match len {
                0..14 => Layer::Ethernet,
                14..34 => Layer::Ipv4,
                34..42 => Layer::Udp,
                42..54 => Layer::Bth,
                54..66 => Layer::Deth,
                66..84 => Layer::IncHeader,
                _ if len < frame.len() - ICRC_LEN => Layer::Payload,
                _ => Layer::Icrc,
            };
            assert_eq!(layer, expected, "prefix of {len} bytes");
        }
    }
}

fn with_header(mutate: impl FnOnce(&mut IncHeader), body: &[u8]) -> Vec<u8> {
    let mut h = data_header(1, 0, Op::Max, Dtype::U16, 0, 0, (body.len() / 2) as u16);
    mutate(&mut h);
    encode(&Addressing::default(), &h, body)
}

#[test]
fn each_malformation_has_its_reason() {
    let body = [0u8; 8];
    let cases: Vec<(Vec<u8>, Malformed)> = vec![
        (
            with_header(|h| h.tag_high = [0; 4], &body),
            Malformed::BadTag,
        ),
        (with_header(|h| h.data_flag = 9, &body), Malformed::BadKind),
        (
            with_header(|h| h.comm_id = CONTROL_COMM_ID, &body),
            Malformed::BadKind,
        ),
        (
            with_header(|h| h.data_flag = PacketKind::Kill as u8, &body),
            Malformed::BadKind,
        ),
        (with_header(|h| h.op_code = 12, &body), Malformed::BadOp),
        (
            with_header(|h| h.oper_and_type = 12, &body),
            Malformed::BadType,
        ),
        (
            with_header(|h| h.pkt_para_num = 5u16.to_be_bytes(), &body),
            Malformed::BadCount,
        ),
        (
            with_header(|h| h.pkt_para_num = [0, 0], &[]),
            Malformed::BadCount,
        ),
        (
            with_header(
                |h| h.pkt_para_num = (MAX_PAYLOAD_BYTES as u16 / 2 + 1).to_be_bytes(),
                &[0; MAX_PAYLOAD_BYTES + 2],
            ),
            Malformed::TooLarge,
        ),
        (
            encode(
                &Addressing::default(),
                &control_header(PacketKind::Notify, 0),
                &[0; 40],
            ),
            Malformed::BadControl,
        ),
    ];
    for (i, (frame, reason)) in cases.iter().enumerate() {
        assert_eq!(
            parse(frame),
            Err(ParseError::Malformed(*reason)),
            "case {i}"
        );
        assert_eq!(classify(frame), Class::Malformed(*reason), "case {i}");
    }
    // The largest legal payload is accepted.
    let max = with_header(
        |h| h.pkt_para_num = (MAX_PAYLOAD_BYTES as u16 / 2).to_be_bytes(),
        &[0; MAX_PAYLOAD_BYTES],
    );
    assert!(parse(&max).is_ok());
}

#[test]
fn inconsistent_lengths_are_bad_length() {
    let frame = sample_data();
    let ip_len_at = ETH_LEN + 2;
    let udp_len_at = ETH_LEN + IPV4_LEN + 4;
    let mut ip_longer = frame.clone();
    ip_longer[ip_len_at + 1] += 4;
    let mut udp_tiny = frame.clone();
    udp_tiny[udp_len_at..udp_len_at + 2].copy_from_slice(&20u16.to_be_bytes());
    udp_tiny[ip_len_at..ip_len_at + 2].copy_from_slice(&40u16.to_be_bytes());
    for f in [ip_longer, udp_tiny] {
        assert!(
            matches!(parse(&f), Err(ParseError::Length(_))),
            "{:?}",
            parse(&f)
        );
        assert_eq!(classify(&f), Class::Malformed(Malformed::BadLength));
    }
}

#[test]
fn foreign_traffic_is_not_inc() {
    let frame = sample_data();
    let mut arp = frame.clone();
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    let mut tcp = frame.clone();
    tcp[ETH_LEN + 9] = 6;
    let mut other_port = frame.clone();
    other_port[ETH_LEN + IPV4_LEN + 3] = 0xb8;
    let mut fragment = frame.clone();
    fragment[ETH_LEN + 7] = 0x01; // a later fragment: no ports to tell it by
    let mut rc_send = frame.clone();
    rc_send[ETH_LEN + IPV4_LEN + UDP_LEN] = 0x04; // RC SEND Only
    let mut untagged = frame.clone();
    untagged[PAYLOAD_OFFSET - INC_LEN] = b'X';
    for f in [&arp, &tcp, &other_port, &fragment] {
        assert_eq!(classify(f), Class::NonRoce);
    }
    for f in [&rc_send, &untagged] {
        assert_eq!(classify(f), Class::RoceOther);
        assert!(matches!(parse(f), Err(ParseError::NotInc(_))));
    }
}

/// Attack (issue 44): IPv4 options or a VLAN tag on a forged result once made the switch
/// skip it while a host's kernel stripped them and took it. Such INC packets are refused.
#[test]
fn inc_with_ip_options_or_vlan_tags_is_refused() {
    let frame = sample_data();
    let mut with_opts = frame[..ETH_LEN].to_vec();
    let mut ip = frame[ETH_LEN..ETH_LEN + IPV4_LEN].to_vec();
    ip[0] = 0x46;
    let total = u16::from_be_bytes([ip[2], ip[3]]) + 4;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip.extend_from_slice(&[1, 1, 1, 0]); // NOP NOP NOP EOL
    ip[10] = 0;
    ip[11] = 0;
    let c = ipv4_checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    with_opts.extend_from_slice(&ip);
    with_opts.extend_from_slice(&frame[ETH_LEN + IPV4_LEN..frame.len() - 4]);
    let crc = crate::icrc::compute(&with_opts, 24, with_opts.len());
    with_opts.extend_from_slice(&crc.to_le_bytes());
    let mut vlan0 = frame.clone();
    vlan0.splice(12..12, [0x81, 0x00, 0x00, 0x00]);
    for f in [&with_opts, &vlan0] {
        assert_eq!(parse(f), Err(ParseError::Malformed(Malformed::Layout)));
        assert_eq!(classify(f), Class::Malformed(Malformed::Layout));
    }
}

/// Attack: a forged INC packet in fragments, which a switch never sees whole and a host
/// reassembles. The first fragment of a datagram to UDP 4791 is refused.
#[test]
fn first_fragments_to_4791_are_refused() {
    let frame = sample_data();
    let mut first = frame.clone();
    first[ETH_LEN + 6] = 0x20; // more fragments, offset 0
    assert_eq!(
        parse(&first).map(|_| ()),
        Err(ParseError::Malformed(Malformed::Fragment))
    );
    assert_eq!(classify(&first), Class::Malformed(Malformed::Fragment));
    let mut other_port = first.clone();
    other_port[ETH_LEN + IPV4_LEN + 3] = 0xb8;
    assert_eq!(classify(&other_port), Class::NonRoce);
}

#[test]
fn element_encoding_is_big_endian_with_locations() {
    assert_eq!(
        encode_elements(Dtype::I16, &[-2, 258], None),
        [0xff, 0xfe, 0x01, 0x02]
    );
    assert_eq!(
        encode_elements(Dtype::U8, &[7], Some(&[-1])),
        [7, 0xff, 0xff, 0xff, 0xff]
    );
    assert_eq!(element_bytes_of(Op::Maxloc, Dtype::F64), 12);
}

fn element_bytes_of(op: Op, dtype: Dtype) -> usize {
    crate::proto::element_bytes(op, dtype)
}

#[test]
fn enums_round_trip_their_wire_values() {
    for op in Op::ALL {
        assert_eq!(Op::from_u8(op as u8), Some(op));
    }
    for t in Dtype::ALL {
        assert_eq!(Dtype::from_u8(t as u8), Some(t));
    }
    for k in PacketKind::ALL {
        assert_eq!(PacketKind::from_u8(k as u8), Some(k));
    }
    assert_eq!(Op::from_u8(12), None);
    assert_eq!(Dtype::from_u8(12), None);
    assert_eq!(PacketKind::from_u8(4), None);
}

#[test]
fn replace_body_keeps_the_frame_valid() {
    let (mut frame, mut payload) = sample_control();
    let udp_check = ETH_LEN + IPV4_LEN + 6;
    frame[udp_check] = 0xab; // as if a host's kernel had checksummed it
    payload.set_ava_grp_num(5);
    replace_body(&mut frame, as_bytes(&payload)).expect("same length");
    let p = parse(&frame).expect("valid, ICRC recomputed");
    assert_eq!(p.control().unwrap().ava_grp_num(), 5);
    assert_eq!(&frame[udp_check..udp_check + 2], &[0, 0]);
    assert!(matches!(
        replace_body(&mut frame, &[0; 8]),
        Err(ParseError::Length(_))
    ));
}

#[test]
fn turn_around_answers_the_sender() {
    let mut p = ControlPayload::default();
    p.set_true_comm_id(0x00ab_cdef);
    let addr = Addressing {
        src_mac: [2, 0, 0, 0, 0, 1],
        dst_mac: [2, 0, 0, 0, 0, 2],
        src_ip: Ipv4Addr::new(10, 77, 0, 1),
        dst_ip: Ipv4Addr::new(10, 77, 1, 1),
        ..Addressing::default()
    };
    let mut frame = encode_control(&addr, PacketKind::Query, 3, &p);
    turn_around(&mut frame, PacketKind::Notify).expect("valid frame");
    p.set_tor1_ip(u32::from(Ipv4Addr::new(10, 77, 255, 1)));
    replace_body(&mut frame, as_bytes(&p)).expect("same length");
    let back = parse(&frame).expect("valid: checksums and ICRC right");
    assert_eq!(back.verdict, Verdict::Control(PacketKind::Notify));
    assert_eq!(
        (back.addr.src_ip, back.addr.dst_ip),
        (addr.dst_ip, addr.src_ip)
    );
    assert_eq!(
        (back.addr.src_mac, back.addr.dst_mac),
        (addr.dst_mac, addr.src_mac)
    );
    assert_eq!(back.control().unwrap().tor1_ip(), 0x0a4d_ff01);
    assert!(turn_around(&mut [0u8; 20], PacketKind::Notify).is_err());
}

#[test]
fn payload_frame_pieces_around_a_body_are_the_encoded_payload() {
    let addr = Addressing {
        src_ip: Ipv4Addr::new(10, 1, 0, 1),
        dst_ip: Ipv4Addr::new(10, 1, 0, 2),
        ..Addressing::default()
    };
    // Odd lengths carry pad bytes before the ICRC.
    for len in [0usize, 1, 2, 3, 4, 5, 1407, 1408, 8192] {
        let body: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        let hdr = data_header(0x00_0abc, 3, Op::Bxor, Dtype::U8, 5, 1, len as u16);
        let whole = encode_payload(&addr, &hdr, &body);
        let mut frame = PayloadFrame::new(&addr, 0, &hdr, &body);
        let joined = |f: &PayloadFrame| [&f.head[..], &body, f.tail()].concat();
        assert_eq!(joined(&frame), whole, "body of {len} B");
        // Renumbered: the ICRC a frame of that IPv4 id carries, nothing else changed.
        frame.renumber(&addr, 9, &body);
        let ib = &whole[..whole.len() - ICRC_LEN];
        let mut expected = ib.to_vec();
        expected.extend_from_slice(&payload_icrc(&addr, 9, ib).to_le_bytes());
        assert_eq!(joined(&frame), expected, "body of {len} B, IPv4 id 9");
    }
}
