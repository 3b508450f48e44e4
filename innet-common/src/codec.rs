//! Userspace encoding and decoding of INC frames (Ethernet → ICRC).
//!
//! [`encode`] builds a complete, well-formed RoCEv2 UD frame: IPv4 checksum, UDP length
//! (UDP checksum 0, as RoCEv2 allows), BTH pad count and pad bytes, ICRC. [`parse`]
//! checks every layer, rejects every truncation with the layer it happened in, validates the
//! INC header with the same [`validate_inc`](crate::validate::validate_inc) the XDP classifier runs, and verifies the ICRC.
//! [`classify`] is the userspace model of the XDP classifier (same classes, no ICRC check).

use core::net::Ipv4Addr;
use std::vec::Vec;

use bytes::BufMut;

pub use crate::validate::Class;

mod parse;
pub use parse::{
    IbParts, Layer, ParseError, Parsed, classify, parse, parse_udp_payload, parse_unverified,
    replace_body, turn_around,
};

use crate::{
    icrc,
    proto::{
        BTH_OPCODE_UD_SEND_ONLY, BTH_PKEY_DEFAULT, CONTROL_COMM_ID, Dtype, INC_DEST_QP, INC_QKEY,
        INC_TAG_HIGH, INC_TAG_LOW, Op, PacketKind, ROCEV2_UDP_PORT,
    },
    wire::{
        BTH_LEN, Bth, ControlPayload, DETH_LEN, Deth, ETH_LEN, ICRC_LEN, INC_LEN, IPV4_LEN,
        IncHeader, UDP_LEN,
    },
};

/// Where a frame goes: the Ethernet, IPv4, UDP and IB addressing of one INC packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addressing {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src_ip: Ipv4Addr,
    pub dst_ip: Ipv4Addr,
    /// RoCEv2 uses the UDP source port for flow entropy.
    pub udp_src_port: u16,
    pub ttl: u8,
    pub src_qp: u32,
    pub dest_qp: u32,
    pub psn: u32,
    /// BTH partition key: isolates jobs (the host-to-host packets of one job carry its own).
    pub pkey: u16,
}

impl Default for Addressing {
    fn default() -> Self {
        Self {
            src_mac: [0x02, 0, 0, 0, 0, 1],
            dst_mac: [0x02, 0, 0, 0, 0, 2],
            src_ip: Ipv4Addr::new(10, 0, 0, 1),
            dst_ip: Ipv4Addr::new(10, 0, 0, 2),
            udp_src_port: 49152,
            ttl: 64,
            src_qp: INC_DEST_QP,
            dest_qp: INC_DEST_QP,
            psn: 0,
            pkey: BTH_PKEY_DEFAULT,
        }
    }
}

/// The INC header of a data packet.
#[must_use]
pub fn data_header(
    group: u32,
    src_rank: u32,
    op: Op,
    dtype: Dtype,
    req_id: u8,
    pkt_index: u8,
    count: u16,
) -> IncHeader {
    let mut h = IncHeader {
        tag_low: INC_TAG_LOW.to_be_bytes(),
        src_rank: src_rank.to_be_bytes(),
        data_flag: PacketKind::Data as u8,
        op_code: op as u8,
        oper_and_type: dtype as u8,
        req_id,
        req_pkt_num: pkt_index,
        pkt_para_num: count.to_be_bytes(),
        tag_high: INC_TAG_HIGH.to_be_bytes(),
        ..IncHeader::default()
    };
    h.set_group(group);
    h
}

/// The INC header of a control packet (query, notify or kill).
#[must_use]
pub fn control_header(kind: PacketKind, src_rank: u32) -> IncHeader {
    IncHeader {
        tag_low: INC_TAG_LOW.to_be_bytes(),
        src_rank: src_rank.to_be_bytes(),
        data_flag: kind as u8,
        comm_id: CONTROL_COMM_ID,
        tag_high: INC_TAG_HIGH.to_be_bytes(),
        ..IncHeader::default()
    }
}

/// Pad bytes that make the IB payload (INC header + body) a multiple of 4.
#[must_use]
pub const fn pad_for(body_len: usize) -> usize {
    (4 - (INC_LEN + body_len) % 4) % 4
}

/// One's-complement checksum of an IPv4 header.
#[must_use]
pub fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Builds a complete frame: `hdr` followed by `body` (data elements, big-endian, or one
/// encoded [`ControlPayload`]). Lengths, checksums, padding and ICRC are filled in here;
/// nothing is validated, so tests can build malformed INC headers on purpose.
#[must_use]
pub fn encode(addr: &Addressing, hdr: &IncHeader, body: &[u8]) -> Vec<u8> {
    let udp_len = UDP_LEN + ib_len(body.len()) + ICRC_LEN;
    let (ip, udp) = ip_udp_headers(addr, 0, udp_len);
    let mut f = Vec::with_capacity(ETH_LEN + IPV4_LEN + udp_len);
    f.put_slice(&addr.dst_mac);
    f.put_slice(&addr.src_mac);
    f.put_u16(0x0800);
    f.put_slice(&ip);
    f.put_slice(&udp);
    put_ib(&mut f, addr, hdr, body);
    let crc = icrc::compute_parts(&ip, &udp, &f[ETH_LEN + IPV4_LEN + UDP_LEN..]);
    f.put_u32_le(crc);
    f
}

/// The UDP payload of [`encode`]'s frame (BTH to ICRC), built without the frame around it:
/// what a host hands its UDP socket, one copy of `body`.
#[must_use]
pub fn encode_payload(addr: &Addressing, hdr: &IncHeader, body: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(ib_len(body.len()) + ICRC_LEN);
    put_ib(&mut p, addr, hdr, body);
    let crc = payload_icrc(addr, 0, &p);
    p.put_u32_le(crc);
    p
}

/// Bytes of the IB headers (BTH, DETH, INC) in front of a data packet's body.
pub const IB_HEAD_LEN: usize = BTH_LEN + DETH_LEN + INC_LEN;

/// [`encode_payload`]'s datagram without its body: the IB headers that go before it and the
/// pad bytes and ICRC that go after, for a sender that hands the kernel the body where it
/// lies (one iovec each) instead of copying it into a packet.
#[derive(Clone, Copy, Debug)]
pub struct PayloadFrame {
    pub head: [u8; IB_HEAD_LEN],
    tail: [u8; 3 + ICRC_LEN],
    tail_len: usize,
}

impl PayloadFrame {
    /// The datagram's pieces around `body`, with the ICRC of a frame of IPv4 id `ip_id`
    /// (see [`payload_icrc`]): `head ++ body ++ tail()` is [`encode_payload`]'s datagram.
    #[must_use]
    pub fn new(addr: &Addressing, ip_id: u16, hdr: &IncHeader, body: &[u8]) -> Self {
        let mut frame = Self {
            head: [0; IB_HEAD_LEN],
            tail: [0; 3 + ICRC_LEN],
            tail_len: pad_for(body.len()) + ICRC_LEN,
        };
        // Written in place: no buffer of its own for every packet a window sends.
        put_ib_head(&mut &mut frame.head[..], addr, hdr, body.len());
        frame.renumber(addr, ip_id, body);
        frame
    }

    /// Rewrites the ICRC for a frame of IPv4 id `ip_id` (`addr` and `body` as given to
    /// [`new`](Self::new)): the id of the segment a GSO super-datagram sends it as.
    pub fn renumber(&mut self, addr: &Addressing, ip_id: u16, body: &[u8]) {
        let pad = self.tail_len - ICRC_LEN;
        let udp_len = UDP_LEN + IB_HEAD_LEN + body.len() + self.tail_len;
        let (ip, udp) = ip_udp_headers(addr, ip_id, udp_len);
        // The pad bytes stay the zeros `new` wrote.
        let crc = icrc::compute_pieces(&ip, &udp, &[&self.head, body, &self.tail[..pad]]);
        self.tail[pad..self.tail_len].copy_from_slice(&crc.to_le_bytes());
    }

    /// The pad bytes and the ICRC: what goes after the body.
    #[must_use]
    pub fn tail(&self) -> &[u8] {
        &self.tail[..self.tail_len]
    }
}

/// The ICRC of a UDP payload whose IB part (BTH up to the ICRC) is `ib`, sent as addressed
/// by `addr` in an IPv4 packet of id `ip_id`.
#[must_use]
pub fn payload_icrc(addr: &Addressing, ip_id: u16, ib: &[u8]) -> u32 {
    let (ip, udp) = ip_udp_headers(addr, ip_id, UDP_LEN + ib.len() + ICRC_LEN);
    icrc::compute_parts(&ip, &udp, ib)
}

/// Bytes of [`encode_payload`]'s datagram (BTH to ICRC) with `body_len` bytes of body.
#[must_use]
pub const fn payload_len(body_len: usize) -> usize {
    ib_len(body_len) + ICRC_LEN
}

/// Bytes of the IB part (BTH to the pad bytes, ICRC aside) of a packet with `body_len`
/// bytes of body.
const fn ib_len(body_len: usize) -> usize {
    BTH_LEN + DETH_LEN + INC_LEN + body_len + pad_for(body_len)
}

/// The IPv4 and UDP headers of a packet of IPv4 id `ip_id` whose UDP length is `udp_len`.
fn ip_udp_headers(
    addr: &Addressing,
    ip_id: u16,
    udp_len: usize,
) -> ([u8; IPV4_LEN], [u8; UDP_LEN]) {
    let [t0, t1] = ((IPV4_LEN + udp_len) as u16).to_be_bytes();
    let [i0, i1] = ip_id.to_be_bytes();
    let [s0, s1, s2, s3] = addr.src_ip.octets();
    let [d0, d1, d2, d3] = addr.dst_ip.octets();
    // DF: what an unconnected socket with IP_PMTUDISC_DO sends (innet-client's INC
    // sockets), so the ICRC holds for the frame the host's kernel builds.
    let mut ip = [
        0x45, 0, t0, t1, i0, i1, 0x40, 0, addr.ttl, 17, 0, 0, s0, s1, s2, s3, d0, d1, d2, d3,
    ];
    let csum = ipv4_checksum(&ip);
    ip[10..12].copy_from_slice(&csum.to_be_bytes());
    let [p0, p1] = addr.udp_src_port.to_be_bytes();
    let [q0, q1] = ROCEV2_UDP_PORT.to_be_bytes();
    let [l0, l1] = (udp_len as u16).to_be_bytes();
    (ip, [p0, p1, q0, q1, l0, l1, 0, 0])
}

/// BTH, DETH, `hdr`, `body` and the pad bytes: the IB part of the UDP payload, ICRC aside.
fn put_ib(out: &mut Vec<u8>, addr: &Addressing, hdr: &IncHeader, body: &[u8]) {
    put_ib_head(out, addr, hdr, body.len());
    out.put_slice(body);
    out.put_bytes(0, pad_for(body.len()));
}

/// BTH, DETH and `hdr`: the IB headers in front of a body of `body_len` bytes.
fn put_ib_head(out: &mut impl BufMut, addr: &Addressing, hdr: &IncHeader, body_len: usize) {
    let pad = pad_for(body_len);
    let mut bth = Bth {
        opcode: BTH_OPCODE_UD_SEND_ONLY,
        flags: (pad as u8) << 4,
        pkey: addr.pkey.to_be_bytes(),
        ..Bth::default()
    };
    bth.set_dest_qp(addr.dest_qp);
    bth.set_psn(addr.psn);
    out.put_slice(as_bytes(&bth));
    let mut deth = Deth {
        qkey: INC_QKEY.to_be_bytes(),
        ..Deth::default()
    };
    deth.set_src_qp(addr.src_qp);
    out.put_slice(as_bytes(&deth));
    out.put_slice(as_bytes(hdr));
}

/// A whole control frame.
#[must_use]
pub fn encode_control(
    addr: &Addressing,
    kind: PacketKind,
    src_rank: u32,
    p: &ControlPayload,
) -> Vec<u8> {
    encode(addr, &control_header(kind, src_rank), as_bytes(p))
}

/// Views a wire struct as its bytes.
#[must_use]
pub fn as_bytes<T: WireStruct>(v: &T) -> &[u8] {
    // SAFETY: WireStruct types are repr(C) with only byte-array fields: no padding, align 1.
    unsafe { core::slice::from_raw_parts(core::ptr::from_ref(v).cast::<u8>(), size_of::<T>()) }
}

/// Reads a wire struct from the start of `bytes` (which must be long enough).
#[must_use]
pub fn read<T: WireStruct>(bytes: &[u8]) -> T {
    assert!(bytes.len() >= size_of::<T>());
    // SAFETY: length checked; every bit pattern is valid for byte-array structs.
    unsafe { core::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) }
}

/// Marker for the byte-array wire structs ([`Bth`], [`Deth`], [`IncHeader`],
/// [`ControlPayload`]): `repr(C)`, alignment 1, any bit pattern valid.
pub trait WireStruct: Copy + sealed::Sealed {}
mod sealed {
    pub trait Sealed {}
}
macro_rules! wire_struct {
    ($($t:ty),*) => { $(impl sealed::Sealed for $t {} impl WireStruct for $t {})* };
}
wire_struct!(Bth, Deth, IncHeader, ControlPayload);

/// Encodes `values` as `dtype` elements (big-endian, truncating to the type's width), with
/// `locations` appended per element for MINLOC/MAXLOC.
#[must_use]
pub fn encode_elements(dtype: Dtype, values: &[i64], locations: Option<&[i32]>) -> Vec<u8> {
    let w = dtype.width();
    let mut out = Vec::with_capacity(values.len() * (w + 4));
    for (i, v) in values.iter().enumerate() {
        out.extend_from_slice(&v.to_be_bytes()[8 - w..]);
        if let Some(locs) = locations {
            out.extend_from_slice(&locs[i].to_be_bytes());
        }
    }
    out
}

#[cfg(test)]
mod tests;
