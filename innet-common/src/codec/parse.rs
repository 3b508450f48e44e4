//! Decoding: [`parse`] checks every layer of a frame and its ICRC, [`classify`] models the
//! XDP classifier, and the in-place edits the daemon makes to a frame it re-sends.

use core::net::Ipv4Addr;

use super::{Addressing, Class, read};
use crate::{
    icrc,
    proto::{BTH_OPCODE_UD_SEND_ONLY, INC_TAG_LOW, PacketKind, ROCEV2_UDP_PORT},
    validate::{Malformed, Verdict, validate_inc},
    wire::{
        BTH_LEN, Bth, ControlPayload, DETH_LEN, Deth, ETH_LEN, ICRC_LEN, INC_LEN, IPV4_LEN,
        IncHeader, MAX_VLAN_TAGS, UDP_LEN, VLAN_TAG_LEN, is_handoff_mac, is_vlan_ethertype,
    },
};

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
        } else if is_handoff_mac(frame[0..6].try_into().expect("6 bytes")) {
            Err(ParseError::Malformed(Malformed::Handoff))
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
