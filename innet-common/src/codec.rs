//! Userspace encoding and decoding of INC frames (Ethernet → ICRC).
//!
//! [`encode`] builds a complete, well-formed RoCEv2 UD frame: IPv4 checksum, UDP length
//! (UDP checksum 0, as RoCEv2 allows), BTH pad count and pad bytes, ICRC. [`parse`]
//! checks every layer, rejects every truncation with the layer it happened in, validates the
//! INC header with the same [`validate_inc`] the XDP classifier runs, and verifies the ICRC.
//! [`classify`] is the userspace model of the XDP classifier (same classes, no ICRC check).

use core::net::Ipv4Addr;
use std::vec::Vec;

use bytes::BufMut;

pub use crate::validate::Class;

use crate::{
    icrc,
    proto::{
        BTH_OPCODE_UD_SEND_ONLY, BTH_PKEY_DEFAULT, CONTROL_COMM_ID, Dtype, INC_DEST_QP, INC_QKEY,
        INC_TAG_HIGH, INC_TAG_LOW, Op, PacketKind, ROCEV2_UDP_PORT,
    },
    validate::{Malformed, Verdict, validate_inc},
    wire::{
        BTH_LEN, Bth, ControlPayload, DETH_LEN, Deth, ETH_LEN, ICRC_LEN, INC_LEN, IPV4_LEN,
        IncHeader, MAX_VLAN_TAGS, UDP_LEN, VLAN_TAG_LEN, is_vlan_ethertype,
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

/// The header layer a truncation or length problem was found in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layer {
    Ethernet,
    Ipv4,
    Udp,
    Bth,
    Deth,
    IncHeader,
    Payload,
    Icrc,
}

/// Why [`parse`] refused a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("frame truncated in the {layer:?} header: needs {need} bytes, has {have}")]
    Truncated {
        layer: Layer,
        need: usize,
        have: usize,
    },
    #[error("not IPv4 (ethertype {ether_type:#06x})")]
    NotIpv4 { ether_type: u16 },
    #[error("IPv4 header is invalid: {0}")]
    BadIpv4(&'static str),
    #[error("IPv4 fragment: RoCEv2 frames are never fragmented")]
    Fragment,
    #[error("not UDP (IP protocol {proto})")]
    NotUdp { proto: u8 },
    #[error("not RoCEv2 (UDP destination port {port}, expected 4791)")]
    NotRoce { port: u16 },
    #[error("RoCEv2 but not INC: {0}")]
    NotInc(&'static str),
    #[error("IPv4/UDP lengths disagree with the frame: {0}")]
    Length(&'static str),
    #[error("malformed INC packet: {}", .0.name())]
    Malformed(Malformed),
    #[error("ICRC mismatch: frame carries {found:#010x}, computed {computed:#010x}")]
    BadIcrc { found: u32, computed: u32 },
}

impl ParseError {
    /// The class the XDP classifier puts such a frame in; `None` for a bad ICRC, which the
    /// classifier does not check (the frame's class is then that of its INC header).
    #[must_use]
    pub fn class(&self) -> Option<Class> {
        Some(match self {
            Self::Truncated {
                layer: Layer::Ethernet | Layer::Ipv4 | Layer::Udp,
                ..
            }
            | Self::NotIpv4 { .. }
            | Self::BadIpv4(_)
            | Self::Fragment
            | Self::NotUdp { .. }
            | Self::NotRoce { .. } => Class::NonRoce,
            Self::Truncated {
                layer: Layer::Bth | Layer::Deth,
                ..
            }
            | Self::NotInc(_) => Class::RoceOther,
            Self::Truncated { .. } => Class::Malformed(Malformed::Truncated),
            Self::Length(_) => Class::Malformed(Malformed::BadLength),
            Self::Malformed(m) => Class::Malformed(*m),
            Self::BadIcrc { .. } => return None,
        })
    }
}

/// A decoded INC frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parsed<'a> {
    pub addr: Addressing,
    pub bth: Bth,
    pub deth: Deth,
    pub inc: IncHeader,
    pub verdict: Verdict,
    /// Data elements or the control payload (pad bytes and ICRC excluded).
    pub body: &'a [u8],
    pub icrc: u32,
}

impl Parsed<'_> {
    /// The control payload, for control packets.
    #[must_use]
    pub fn control(&self) -> Option<ControlPayload> {
        matches!(self.verdict, Verdict::Control(_)).then(|| read(self.body))
    }
}

fn need(frame: &[u8], layer: Layer, end: usize) -> Result<(), ParseError> {
    if frame.len() < end {
        return Err(ParseError::Truncated {
            layer,
            need: end,
            have: frame.len(),
        });
    }
    Ok(())
}

/// Decodes and checks a whole INC frame, ICRC included.
///
/// # Errors
/// The first problem found, outermost layer first.
pub fn parse(frame: &[u8]) -> Result<Parsed<'_>, ParseError> {
    let (parsed, icrc_offset, ip_len) = parse_inner(frame)?;
    let computed = icrc::compute(frame, ip_len, icrc_offset);
    if computed != parsed.icrc {
        return Err(ParseError::BadIcrc {
            found: parsed.icrc,
            computed,
        });
    }
    Ok(parsed)
}

/// Decodes and checks a whole INC frame but not its ICRC: for frames whose IP header a
/// host's kernel wrote (sent through a UDP socket), where the ICRC could not be known.
///
/// # Errors
/// As [`parse`], without [`ParseError::BadIcrc`].
pub fn parse_unverified(frame: &[u8]) -> Result<Parsed<'_>, ParseError> {
    parse_inner(frame).map(|(p, ..)| p)
}

/// Replaces the body of a valid INC frame with `body` (same length), clears the UDP
/// checksum and recomputes the ICRC, so the frame leaves as a well-formed RoCEv2 packet.
///
/// # Errors
/// The frame does not parse, or `body` has a different length.
pub fn replace_body(frame: &mut [u8], body: &[u8]) -> Result<(), ParseError> {
    let (p, icrc_offset, ip_len) = parse_inner(frame)?;
    if p.body.len() != body.len() {
        return Err(ParseError::Length("replacement body differs in length"));
    }
    let start = p.body.as_ptr() as usize - frame.as_ptr() as usize;
    frame[start..start + body.len()].copy_from_slice(body);
    // The sender's UDP checksum no longer matches; RoCEv2 allows none (0).
    let udp_check = ETH_LEN + ip_len + 6;
    frame[udp_check..udp_check + 2].fill(0);
    let crc = icrc::compute(frame, ip_len, icrc_offset);
    frame[icrc_offset..icrc_offset + ICRC_LEN].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Turns a valid INC control frame around to answer its sender with `kind`: Ethernet and
/// IPv4 addresses swapped (the IPv4 checksum is a sum, so it stays right) and the INC
/// header's kind set. The body is the caller's to rewrite with [`replace_body`], which also
/// recomputes the ICRC.
///
/// # Errors
/// The frame does not parse.
pub fn turn_around(frame: &mut [u8], kind: PacketKind) -> Result<(), ParseError> {
    let (_, _, ip_len) = parse_inner(frame)?;
    let (dst, src) = frame.split_at_mut(6);
    dst.swap_with_slice(&mut src[..6]);
    let ip = ETH_LEN + 12;
    let (src_ip, dst_ip) = frame[ip..ip + 8].split_at_mut(4);
    src_ip.swap_with_slice(dst_ip);
    let inc = ETH_LEN + ip_len + UDP_LEN + BTH_LEN + DETH_LEN;
    frame[inc + core::mem::offset_of!(IncHeader, data_flag)] = kind as u8;
    Ok(())
}

/// The class the XDP classifier gives `frame` (the reference model of its tests).
#[must_use]
pub fn classify(frame: &[u8]) -> Class {
    match parse_inner(frame) {
        Ok((p, ..)) => match p.verdict {
            Verdict::Data { .. } => Class::IncData,
            Verdict::Control(_) => Class::IncControl,
        },
        Err(e) => e.class().expect("parse_inner never checks the ICRC"),
    }
}

/// Where a frame's IPv4 header starts and how long it is.
struct Ipv4At {
    l3: usize,
    ip_len: usize,
}

impl Ipv4At {
    /// The one layout the data path reads at fixed offsets: untagged, no IPv4 options.
    fn canonical(&self) -> bool {
        self.l3 == ETH_LEN && self.ip_len == IPV4_LEN
    }
}

/// Checks Ethernet (through up to [`MAX_VLAN_TAGS`] VLAN tags), IPv4 and UDP up to "this is
/// RoCEv2"; returns where the IPv4 header is. The first fragment of a datagram to UDP 4791,
/// and a first UDP fragment too short to show its ports, are [`Malformed::Fragment`]: a
/// host would reassemble an INC packet the switch never saw whole.
fn parse_to_rocev2(frame: &[u8]) -> Result<Ipv4At, ParseError> {
    need(frame, Layer::Ethernet, ETH_LEN)?;
    let mut l3 = ETH_LEN;
    let mut ether_type = u16::from_be_bytes([frame[12], frame[13]]);
    for _ in 0..MAX_VLAN_TAGS {
        if !is_vlan_ethertype(ether_type) {
            break;
        }
        need(frame, Layer::Ethernet, l3 + VLAN_TAG_LEN)?;
        ether_type = u16::from_be_bytes([frame[l3 + 2], frame[l3 + 3]]);
        l3 += VLAN_TAG_LEN;
    }
    if is_vlan_ethertype(ether_type) {
        return Err(ParseError::Malformed(Malformed::Layout));
    }
    if ether_type != 0x0800 {
        return Err(ParseError::NotIpv4 { ether_type });
    }
    need(frame, Layer::Ipv4, l3 + IPV4_LEN)?;
    let ip = &frame[l3..];
    if ip[0] >> 4 != 4 {
        return Err(ParseError::BadIpv4("version is not 4"));
    }
    let ip_len = usize::from(ip[0] & 0xf) * 4;
    if ip_len < IPV4_LEN {
        return Err(ParseError::BadIpv4("IHL below 5"));
    }
    need(frame, Layer::Ipv4, l3 + ip_len)?;
    let frag = u16::from_be_bytes([ip[6], ip[7]]);
    let udp_off = l3 + ip_len;
    if frag & 0x3fff != 0 {
        let offset = frag & 0x1fff;
        let first = offset == 0;
        if !first || ip[9] != 17 {
            return Err(ParseError::Fragment);
        }
        let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        if frame.len() < udp_off + UDP_LEN || total < ip_len + UDP_LEN {
            return Err(ParseError::Malformed(Malformed::Fragment));
        }
        let port = u16::from_be_bytes([frame[udp_off + 2], frame[udp_off + 3]]);
        return Err(if port == ROCEV2_UDP_PORT {
            ParseError::Malformed(Malformed::Fragment)
        } else {
            ParseError::Fragment
        });
    }
    if ip[9] != 17 {
        return Err(ParseError::NotUdp { proto: ip[9] });
    }
    need(frame, Layer::Udp, udp_off + UDP_LEN)?;
    let udp = &frame[udp_off..];
    let port = u16::from_be_bytes([udp[2], udp[3]]);
    if port != ROCEV2_UDP_PORT {
        return Err(ParseError::NotRoce { port });
    }
    Ok(Ipv4At { l3, ip_len })
}

fn parse_inner(frame: &[u8]) -> Result<(Parsed<'_>, usize, usize), ParseError> {
    let at = parse_to_rocev2(frame)?;
    let ip_len = at.ip_len;
    let ip = &frame[at.l3..];
    let udp_off = at.l3 + ip_len;
    let udp = &frame[udp_off..];
    let udp_len = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
    let ip_total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let ib = parse_ib(frame, udp_off + UDP_LEN, udp_len, || {
        // An INC packet in any other layout is refused before its lengths are read: the
        // switch's data path could not member-check it (see `Malformed::Layout`).
        if !at.canonical() {
            Err(ParseError::Malformed(Malformed::Layout))
        } else if ip_total == ip_len + udp_len {
            Ok(())
        } else {
            Err(ParseError::Length(
                "IPv4 total length ≠ IPv4 header + UDP length",
            ))
        }
    })?;
    let addr = Addressing {
        dst_mac: frame[0..6].try_into().expect("6 bytes"),
        src_mac: frame[6..12].try_into().expect("6 bytes"),
        src_ip: Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
        dst_ip: Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
        udp_src_port: u16::from_be_bytes([udp[0], udp[1]]),
        ttl: ip[8],
        src_qp: ib.deth.src_qp(),
        dest_qp: ib.bth.dest_qp(),
        psn: ib.bth.psn(),
        pkey: ib.bth.pkey(),
    };
    let parsed = Parsed {
        addr,
        bth: ib.bth,
        deth: ib.deth,
        inc: ib.inc,
        verdict: ib.verdict,
        body: &frame[ib.body],
        icrc: ib.icrc,
    };
    Ok((parsed, ib.icrc_offset, ip_len))
}

/// The RoCEv2 part of an INC packet (BTH … ICRC), as [`parse_udp_payload`] finds it; offsets are
/// into the buffer it was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IbParts {
    pub bth: Bth,
    pub deth: Deth,
    pub inc: IncHeader,
    pub verdict: Verdict,
    /// Data elements or the control payload (pad bytes and ICRC excluded).
    pub body: core::ops::Range<usize>,
    pub icrc: u32,
    pub icrc_offset: usize,
}

/// Decodes and checks the UDP payload of an INC packet (BTH … ICRC), as a host's socket
/// receives it, without copying it: every check [`parse_unverified`] makes past the UDP
/// header. The ICRC is not checked (it covers IPv4 fields the socket does not show).
///
/// # Errors
/// As [`parse_unverified`], for the layers from the BTH on.
pub fn parse_udp_payload(payload: &[u8]) -> Result<IbParts, ParseError> {
    let udp_len = UDP_LEN + payload.len();
    if u16::try_from(udp_len).is_err() {
        return Err(ParseError::Length("UDP payload longer than a datagram"));
    }
    parse_ib(payload, 0, udp_len, || Ok(()))
}

/// Decodes BTH, DETH and INC header at `bth_off` of `buf`, in a UDP datagram of `udp_len`
/// bytes (header included) that ends `udp_len - UDP_LEN` bytes past `bth_off`; checks the
/// lengths (`lengths_agree`: the layers below, once the packet claims to be INC), the pad
/// count and the INC header.
fn parse_ib(
    buf: &[u8],
    bth_off: usize,
    udp_len: usize,
    lengths_agree: impl FnOnce() -> Result<(), ParseError>,
) -> Result<IbParts, ParseError> {
    need(buf, Layer::Bth, bth_off + BTH_LEN)?;
    let bth: Bth = read(&buf[bth_off..]);
    if bth.opcode != BTH_OPCODE_UD_SEND_ONLY {
        return Err(ParseError::NotInc("BTH opcode is not UD SEND Only"));
    }
    let deth_off = bth_off + BTH_LEN;
    need(buf, Layer::Deth, deth_off + DETH_LEN)?;
    let deth: Deth = read(&buf[deth_off..]);
    let inc_off = deth_off + DETH_LEN;
    // The INC tag decides whether this is ours; a packet too short to hold it is not.
    need(buf, Layer::Deth, inc_off + 4)?;
    if u32::from_be_bytes([
        buf[inc_off],
        buf[inc_off + 1],
        buf[inc_off + 2],
        buf[inc_off + 3],
    ]) != INC_TAG_LOW
    {
        return Err(ParseError::NotInc("no INC tag"));
    }
    // From here on the packet claims to be INC: every problem is a counted rejection.
    need(buf, Layer::IncHeader, inc_off + INC_LEN)?;
    let inc: IncHeader = read(&buf[inc_off..]);
    lengths_agree()?;
    let min_udp = UDP_LEN + BTH_LEN + DETH_LEN + INC_LEN + ICRC_LEN;
    if udp_len < min_udp {
        return Err(ParseError::Length(
            "UDP length too short for INC headers and ICRC",
        ));
    }
    let pad = usize::from(bth.pad_count());
    let body_off = inc_off + INC_LEN;
    if udp_len < min_udp + pad {
        return Err(ParseError::Length("BTH pad count exceeds the payload"));
    }
    let end = bth_off + (udp_len - UDP_LEN);
    if buf.len() < end {
        let layer = if buf.len() < end - ICRC_LEN {
            Layer::Payload
        } else {
            Layer::Icrc
        };
        return Err(ParseError::Truncated {
            layer,
            need: end,
            have: buf.len(),
        });
    }
    let icrc_offset = end - ICRC_LEN;
    let body_len = icrc_offset - pad - body_off;
    let verdict = validate_inc(&inc, body_len).map_err(ParseError::Malformed)?;
    let icrc = u32::from_le_bytes([
        buf[icrc_offset],
        buf[icrc_offset + 1],
        buf[icrc_offset + 2],
        buf[icrc_offset + 3],
    ]);
    Ok(IbParts {
        bth,
        deth,
        inc,
        verdict,
        body: body_off..body_off + body_len,
        icrc,
        icrc_offset,
    })
}

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
#[path = "codec_tests.rs"]
mod tests;
