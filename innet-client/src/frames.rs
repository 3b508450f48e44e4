//! The packets a leader sends and receives on its INC socket (UDP port 4791), as UDP
//! payloads (BTH … ICRC): contributions to the data plane, results from it, control packets,
//! and the host-to-host packets of the host algorithms.
//!
//! Host-to-host packets are ordinary INC data frames of the reserved wire group
//! [`HOST_COMM_ID`], which no switch aggregates, so they cross the fabric untouched:
//! `src_rank` is the sending leader, `req_id` the algorithm step, the BTH PSN the packet's
//! index within the step, and the DETH source QP the collective's sequence number.

use std::net::Ipv4Addr;

use crate::sendmany::Datagram;

use innet_common::{
    codec::{
        Addressing, PayloadFrame, data_header, encode, encode_control, encode_payload,
        parse_udp_payload, payload_len,
    },
    proto::{
        BTH_FLAG_RESULT, Dtype, HOST_COMM_ID, INC_DEST_QP, LOC_BYTES, Op, PacketKind,
        ROCEV2_UDP_PORT, element_bytes,
    },
    validate::Verdict,
    wire::{Bth, ControlPayload, Deth, ETH_LEN, IPV4_LEN, IncHeader, UDP_LEN},
};

/// PSN, source QP and friends are 24-bit fields.
pub const MASK24: u32 = 0x00ff_ffff;

/// A parsed INC packet.
#[derive(Clone, Debug)]
pub struct Frame {
    pub bth: Bth,
    pub deth: Deth,
    pub inc: IncHeader,
    pub verdict: Verdict,
    /// The datagram, which [`body`](Self::body) lies in: the payload is copied once, not
    /// again into a body of its own.
    bytes: Vec<u8>,
    body: std::ops::Range<usize>,
}

impl Frame {
    /// Data elements or the control payload (pad bytes and ICRC excluded).
    #[must_use]
    pub fn body(&self) -> &[u8] {
        &self.bytes[self.body.clone()]
    }

    /// A data packet a switch delivered (aggregated result or reply).
    #[must_use]
    pub fn is_result(&self) -> bool {
        matches!(self.verdict, Verdict::Data { .. }) && self.bth.flags & BTH_FLAG_RESULT != 0
    }

    /// Bytes of the datagram it came in (what holding it costs).
    #[must_use]
    pub fn wire_len(&self) -> usize {
        self.bytes.len()
    }

    /// A host-to-host packet of the host algorithms.
    #[must_use]
    pub fn is_host(&self) -> bool {
        matches!(self.verdict, Verdict::Data { .. }) && self.inc.group() == HOST_COMM_ID
    }

    #[must_use]
    pub fn control(&self) -> Option<ControlPayload> {
        matches!(self.verdict, Verdict::Control(_)).then(|| innet_common::codec::read(self.body()))
    }
}

/// Parses a received UDP payload; `None` for anything that is not a valid INC packet.
#[must_use]
pub fn parse(udp_payload: &[u8]) -> Option<Frame> {
    let p = parse_udp_payload(udp_payload).ok()?;
    Some(Frame {
        bth: p.bth,
        deth: p.deth,
        inc: p.inc,
        verdict: p.verdict,
        body: p.body,
        bytes: udp_payload.to_vec(),
    })
}

/// The partition key of job `job`'s host-to-host packets (full membership bit set; never
/// the default 0xffff): a leader ignores host packets of any other job, such as late
/// packets of a communicator that used the same addresses before.
#[must_use]
pub fn job_pkey(job: u64) -> u16 {
    let folded = (job ^ job >> 16 ^ job >> 32 ^ job >> 48) as u16;
    let pkey = 0x8000 | (folded & 0x7fff);
    if pkey == 0xffff { 0x8001 } else { pkey }
}

/// Addresses of a packet between two INC sockets (the ICRC covers them).
#[must_use]
pub fn addressing(src: Ipv4Addr, dst: Ipv4Addr, psn: u32, src_qp: u32) -> Addressing {
    Addressing {
        src_ip: src,
        dst_ip: dst,
        udp_src_port: ROCEV2_UDP_PORT,
        psn: psn & MASK24,
        src_qp: src_qp & MASK24,
        ..Addressing::default()
    }
}

fn udp_payload(frame: &[u8]) -> Vec<u8> {
    frame[ETH_LEN + IPV4_LEN + UDP_LEN..].to_vec()
}

/// What identifies a data packet besides its group.
#[derive(Clone, Copy, Debug)]
pub struct DataId {
    pub src_rank: u32,
    pub op: Op,
    pub dtype: Dtype,
    /// `req_id`: the aggregation round (contributions) or the algorithm step (host).
    pub req_id: u8,
    pub pkt_index: u32,
}

/// A data packet of `group` with `body` (whole elements, wire order): its UDP payload.
#[must_use]
pub fn data(addr: &Addressing, group: u32, id: DataId, body: &[u8]) -> Vec<u8> {
    encode_payload(addr, &data_id_header(group, id, body.len()), body)
}

/// [`data`]'s datagram with its body left where it lies: the IB headers, `body` and the
/// ICRC go to the kernel as pieces (iovecs), so a long message's packets cost it no copy
/// into packets of their own.
#[derive(Clone, Copy, Debug)]
pub struct DataDatagram<'a> {
    addr: Addressing,
    frame: PayloadFrame,
    body: &'a [u8],
    ip_id: u16,
}

impl<'a> DataDatagram<'a> {
    /// The packet, with the ICRC of a frame of IPv4 id `ip_id` (see
    /// [`set_ip_id`](Self::set_ip_id)).
    #[must_use]
    pub fn new(addr: &Addressing, group: u32, id: DataId, body: &'a [u8], ip_id: u16) -> Self {
        let hdr = data_id_header(group, id, body.len());
        Self {
            addr: *addr,
            frame: PayloadFrame::new(addr, ip_id, &hdr, body),
            body,
            ip_id,
        }
    }

    /// Carries the ICRC of a frame of IPv4 id `ip_id` instead of 0.
    ///
    /// The kernel sends a UDP GSO super-datagram's segments with ids counting up from the
    /// super-datagram's (0 on an INC socket: DF set, unconnected), and the ICRC covers the
    /// id: the datagram that leaves as segment `k` must carry the ICRC of id `k`.
    /// An ICRC runs over the whole body: a datagram already numbered so keeps its own.
    pub fn set_ip_id(&mut self, ip_id: u16) {
        if ip_id != self.ip_id {
            self.frame.renumber(&self.addr, ip_id, self.body);
            self.ip_id = ip_id;
        }
    }
}

impl Datagram for DataDatagram<'_> {
    fn len(&self) -> usize {
        payload_len(self.body.len())
    }
    fn pieces<'b>(&'b self, out: &mut Vec<&'b [u8]>) {
        out.extend([&self.frame.head[..], self.body, self.frame.tail()]);
    }
}

/// A data packet as a whole Ethernet frame (for posting into a NIC).
#[must_use]
pub fn data_frame(addr: &Addressing, group: u32, id: DataId, body: &[u8]) -> Vec<u8> {
    encode(addr, &data_id_header(group, id, body.len()), body)
}

/// The INC header of data packet `id` of `group` carrying `body_len` bytes.
fn data_id_header(group: u32, id: DataId, body_len: usize) -> IncHeader {
    let count = (body_len / innet_common::proto::element_bytes(id.op, id.dtype)) as u16;
    data_header(
        group,
        id.src_rank,
        id.op,
        id.dtype,
        id.req_id,
        id.pkt_index as u8,
        count,
    )
}

/// A control packet (query, notify, kill).
#[must_use]
pub fn control(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    kind: PacketKind,
    rank: u32,
    c: &ControlPayload,
) -> Vec<u8> {
    udp_payload(&encode_control(
        &addressing(src, dst, 0, INC_DEST_QP),
        kind,
        rank,
        c,
    ))
}

/// Whole elements per packet when a packet may carry `max_bytes` of payload.
#[must_use]
pub fn packet_bytes(op: Op, dtype: Dtype, max_bytes: usize) -> usize {
    let e = innet_common::proto::element_bytes(op, dtype);
    (max_bytes / e).max(1) * e
}

/// Converts between the caller's native element order and the wire's big-endian order (its
/// own inverse). MINLOC/MAXLOC elements are a value followed by an `i32` location.
pub fn swap_order(op: Op, dtype: Dtype, buf: &mut [u8]) {
    if cfg!(target_endian = "big") {
        return;
    }
    let (w, e) = (dtype.width(), element_bytes(op, dtype));
    // Plain elements of a fixed width: byte swaps, vectorised where the CPU allows (a long
    // message's two passes over memory).
    if w == e {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("ssse3") {
            // SAFETY: the CPU has SSSE3 (checked just above).
            unsafe { swap_plain_ssse3(w, buf) };
            return;
        }
        swap_plain(w, buf);
        return;
    }
    for el in buf.chunks_exact_mut(e) {
        el[..w].reverse();
        if op.carries_location() {
            el[w..w + LOC_BYTES].reverse();
        }
    }
}

/// `dst = src` converted between native and wire order ([`swap_order`] of a copy) in one
/// pass over memory: a long message's copy into the receive buffer and its conversion
/// were two.
///
/// # Panics
/// `src` and `dst` differ in length.
pub fn swap_order_into(op: Op, dtype: Dtype, src: &[u8], dst: &mut [u8]) {
    assert_eq!(src.len(), dst.len(), "swap_order_into: lengths differ");
    let (w, e) = (dtype.width(), element_bytes(op, dtype));
    if cfg!(target_endian = "big") || w != e || w == 1 {
        dst.copy_from_slice(src);
        swap_order(op, dtype, dst);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("ssse3") {
        // SAFETY: the CPU has SSSE3 (checked just above).
        unsafe { swap_plain_into_ssse3(w, src, dst) };
        return;
    }
    swap_plain_into(w, src, dst);
}

/// Each `w`-byte element of `src`, bytes reversed, into `dst` (same length).
#[inline(always)]
fn swap_plain_into(w: usize, src: &[u8], dst: &mut [u8]) {
    match w {
        2 => swap_each_into(
            src,
            dst,
            u16::from_ne_bytes,
            u16::swap_bytes,
            u16::to_ne_bytes,
        ),
        4 => swap_each_into(
            src,
            dst,
            u32::from_ne_bytes,
            u32::swap_bytes,
            u32::to_ne_bytes,
        ),
        8 => swap_each_into(
            src,
            dst,
            u64::from_ne_bytes,
            u64::swap_bytes,
            u64::to_ne_bytes,
        ),
        _ => {
            for (d, s) in dst.chunks_exact_mut(w).zip(src.chunks_exact(w)) {
                d.copy_from_slice(s);
                d.reverse();
            }
        }
    }
}

/// [`swap_plain_into`] compiled for SSSE3 (see [`swap_plain_ssse3`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "ssse3")]
fn swap_plain_into_ssse3(w: usize, src: &[u8], dst: &mut [u8]) {
    swap_plain_into(w, src, dst);
}

/// Each `N`-byte element of `src` read as an integer, byte-swapped and written to `dst`.
#[inline(always)]
fn swap_each_into<const N: usize, T>(
    src: &[u8],
    dst: &mut [u8],
    read: fn([u8; N]) -> T,
    swap: fn(T) -> T,
    write: fn(T) -> [u8; N],
) {
    for (d, s) in dst.chunks_exact_mut(N).zip(src.chunks_exact(N)) {
        let v: [u8; N] = s.try_into().expect("N bytes");
        d.copy_from_slice(&write(swap(read(v))));
    }
}

/// Reverses the bytes of each `w`-byte element of `buf`.
#[inline(always)]
fn swap_plain(w: usize, buf: &mut [u8]) {
    match w {
        1 => {}
        2 => swap_each(buf, u16::from_ne_bytes, u16::swap_bytes, u16::to_ne_bytes),
        4 => swap_each(buf, u32::from_ne_bytes, u32::swap_bytes, u32::to_ne_bytes),
        8 => swap_each(buf, u64::from_ne_bytes, u64::swap_bytes, u64::to_ne_bytes),
        _ => buf.chunks_exact_mut(w).for_each(<[u8]>::reverse),
    }
}

/// [`swap_plain`] compiled for SSSE3, whose byte shuffle swaps 16 bytes at a time: about
/// twice as fast over a message as the baseline x86-64 build's shifts.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "ssse3")]
fn swap_plain_ssse3(w: usize, buf: &mut [u8]) {
    swap_plain(w, buf);
}

/// Each `N`-byte element of `buf` read as an integer, byte-swapped and written back.
#[inline(always)]
fn swap_each<const N: usize, T>(
    buf: &mut [u8],
    read: fn([u8; N]) -> T,
    swap: fn(T) -> T,
    write: fn(T) -> [u8; N],
) {
    for el in buf.chunks_exact_mut(N) {
        let v: [u8; N] = (&*el).try_into().expect("N bytes");
        el.copy_from_slice(&write(swap(read(v))));
    }
}

#[cfg(test)]
mod tests {
    use innet_common::codec::parse as parse_checked;

    use super::*;

    #[test]
    fn native_order_round_trips_and_minloc_keeps_pairs() {
        let mut b = vec![];
        b.extend_from_slice(&(-5i32).to_ne_bytes());
        b.extend_from_slice(&7i32.to_ne_bytes());
        let orig = b.clone();
        swap_order(Op::Minloc, Dtype::I32, &mut b);
        assert_eq!(&b[..4], &(-5i32).to_be_bytes());
        assert_eq!(&b[4..], &7i32.to_be_bytes());
        swap_order(Op::Minloc, Dtype::I32, &mut b);
        assert_eq!(b, orig);
    }

    #[test]
    fn swapping_into_a_buffer_equals_swapping_a_copy() {
        let src: Vec<u8> = (0..=255u8).cycle().take(4 * 1024 + 24).collect();
        for (op, dtype) in [
            (Op::Sum, Dtype::F64),
            (Op::Sum, Dtype::F32),
            (Op::Sum, Dtype::F16),
            (Op::Bxor, Dtype::U8),
            (Op::Minloc, Dtype::F64),
            (Op::Maxloc, Dtype::I16),
        ] {
            let e = element_bytes(op, dtype);
            let src = &src[..src.len() / e * e];
            let mut expected = src.to_vec();
            swap_order(op, dtype, &mut expected);
            let mut got = vec![0xa5; src.len()];
            swap_order_into(op, dtype, src, &mut got);
            assert_eq!(got, expected, "{op:?} {dtype:?}");
        }
    }

    #[test]
    fn host_packets_round_trip_with_a_valid_icrc() {
        let (a, b) = (Ipv4Addr::new(10, 1, 0, 1), Ipv4Addr::new(10, 1, 0, 2));
        let addr = addressing(a, b, 0x12_3456, 0x00ab_cdef);
        let id = DataId {
            src_rank: 3,
            op: Op::Sum,
            dtype: Dtype::I32,
            req_id: 5,
            pkt_index: 0x12_3456,
        };
        let body: Vec<u8> = (0..64).collect();
        let p = data(&addr, HOST_COMM_ID, id, &body);
        let f = parse(&p).expect("parses");
        assert!(f.is_host() && !f.is_result());
        assert_eq!((f.bth.psn(), f.deth.src_qp()), (0x12_3456, 0x00ab_cdef));
        assert_eq!((f.inc.src_rank(), f.inc.req_id), (3, 5));
        assert_eq!(f.body(), body);
        // The full frame (as the kernel sends it) carries a valid ICRC.
        let frame = encode(
            &addr,
            &data_header(0, 3, Op::Sum, Dtype::I32, 5, 0x56, 16),
            &body,
        );
        parse_checked(&frame).expect("valid ICRC");
    }

    #[test]
    fn a_datagram_in_pieces_is_the_packet_and_renumbers_to_its_ipv4_id() {
        let (a, b) = (Ipv4Addr::new(10, 1, 0, 1), Ipv4Addr::new(10, 1, 0, 2));
        let addr = addressing(a, b, 7, INC_DEST_QP);
        let id = DataId {
            src_rank: 1,
            op: Op::Sum,
            dtype: Dtype::F64,
            req_id: 7,
            pkt_index: 0,
        };
        let body: Vec<u8> = (0..32).collect();
        let mut datagram = DataDatagram::new(&addr, 0x42, id, &body, 0);
        let joined = |d: &DataDatagram<'_>| {
            let mut pieces = vec![];
            d.pieces(&mut pieces);
            assert_eq!(pieces.iter().map(|p| p.len()).sum::<usize>(), d.len());
            pieces.concat()
        };
        assert_eq!(joined(&datagram), data(&addr, 0x42, id, &body), "id 0");
        let mut frame = data_frame(&addr, 0x42, id, &body);
        for ip_id in [1u16, 5, 63, 0x1234] {
            datagram.set_ip_id(ip_id);
            // The frame the kernel sends as that segment: the id in the IPv4 header (the
            // checksum is not covered), the renumbered payload behind it.
            frame[ETH_LEN + 4..ETH_LEN + 6].copy_from_slice(&ip_id.to_be_bytes());
            let at = ETH_LEN + IPV4_LEN + UDP_LEN;
            frame[at..].copy_from_slice(&joined(&datagram));
            parse_checked(&frame).expect("valid ICRC");
        }
    }

    #[test]
    fn garbage_is_not_a_frame() {
        assert!(parse(&[]).is_none());
        assert!(parse(&[0u8; 40]).is_none());
    }
}
