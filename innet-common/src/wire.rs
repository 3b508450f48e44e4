//! On-the-wire layout of an INC packet:
//!
//! ```text
//! Ethernet 14 | IPv4 20 (+options) | UDP 8 (dst 4791) | BTH 12 | DETH 8 | INC 22 |
//!     data: pkt_para_num elements  or  control: ControlPayload 148 | ICRC 4
//! ```
//!
//! Every struct is `#[repr(C)]` with only byte and byte-array fields, so its alignment is 1
//! and it can be read straight out of a packet at any offset (no padding, no unaligned
//! loads). Multi-byte fields are big-endian; accessors convert. Ethernet, IPv4 and UDP come
//! from `network-types`.

pub use network_types::{eth::EthHdr, ip::Ipv4Hdr, udp::UdpHdr};

use crate::proto::{
    BTH_OPCODE_UD_SEND_ONLY, CONTROL_COMM_ID, INC_TAG_LOW, PacketKind, ROCEV2_UDP_PORT,
};

pub const ETH_LEN: usize = EthHdr::LEN;
/// One 802.1Q or 802.1ad tag: TCI and the next Ethertype.
pub const VLAN_TAG_LEN: usize = 4;
/// VLAN tags the classifiers look through; a frame with more is dropped as
/// `Malformed::Layout` whatever it carries (a host's kernel peels VLAN 0 tags one by one,
/// so a deeper stack could still hide an INC packet from a switch).
pub const MAX_VLAN_TAGS: usize = 4;

/// Whether an Ethertype announces a VLAN tag (802.1Q or 802.1ad).
#[must_use]
pub const fn is_vlan_ethertype(ether_type: u16) -> bool {
    matches!(ether_type, 0x8100 | 0x88a8)
}

/// Destination MAC of a result a switch port's emit program passes up to the tc fan-out on
/// the same port (`innet_fanout`): these five bytes, then the mark's flags
/// ([`HANDOFF_EXCLUDE_INGRESS`], [`HANDOFF_FROM_PARENT`]). XDP metadata would carry the
/// mark out of the wire's reach, but not every kernel lets an XDP program move it
/// (`bpf_xdp_adjust_meta` is refused on some); an address can be forged, so the classifier
/// refuses an INC packet that arrives with it (`Malformed::Handoff`), and every frame
/// reaches the port's XDP program before its tc program. Locally administered, unicast.
pub const HANDOFF_MAC_PREFIX: [u8; 5] = [0x02, 0x69, 0x6e, 0x63, 0xfa];
/// Hand-off flag: leave out the child behind the port the frame came in by.
pub const HANDOFF_EXCLUDE_INGRESS: u8 = 1;
/// Hand-off flag: the frame is the parent's result as it arrived (headers and ICRC its own).
pub const HANDOFF_FROM_PARENT: u8 = 2;

/// Whether a frame's destination MAC is a hand-off mark ([`HANDOFF_MAC_PREFIX`]).
#[must_use]
pub fn is_handoff_mac(dst: &[u8; 6]) -> bool {
    dst[0] == HANDOFF_MAC_PREFIX[0]
        && dst[1] == HANDOFF_MAC_PREFIX[1]
        && dst[2] == HANDOFF_MAC_PREFIX[2]
        && dst[3] == HANDOFF_MAC_PREFIX[3]
        && dst[4] == HANDOFF_MAC_PREFIX[4]
}

/// Bytes [`handoff_flags`] reads: every header up to and with the INC header.
pub const HANDOFF_HEADERS_LEN: usize = PAYLOAD_OFFSET;

/// The hand-off flags of a frame that begins with `h` and is `len` bytes long, when the
/// classifiers would call it `Malformed::Handoff` (an INC packet in the one layout the data
/// path reads, untagged IPv4 without options and unfragmented, to the hand-off MAC); `None`
/// for any other frame. The fan-out's test for "the emit program marked this": a port's
/// classifier drops every such frame from the wire before its tc program runs.
#[must_use]
#[expect(
    clippy::verbose_bit_mask,
    reason = "the more-fragments flag and the offset, as the IPv4 header names them"
)]
pub fn handoff_flags(h: &[u8; HANDOFF_HEADERS_LEN], len: usize) -> Option<u8> {
    const IP: usize = ETH_LEN;
    const UDP: usize = ETH_LEN + IPV4_LEN;
    const BTH: usize = UDP + UDP_LEN;
    const TAG: usize = BTH + BTH_LEN + DETH_LEN;
    let be16 = |at: usize| u16::from_be_bytes([h[at], h[at + 1]]);
    let marked = is_handoff_mac(&[h[0], h[1], h[2], h[3], h[4], h[5]])
        && len >= HANDOFF_HEADERS_LEN
        && be16(12) == 0x0800
        && h[IP] == 0x45
        && be16(IP + 6) & 0x3fff == 0
        && h[IP + 9] == 17
        && be16(UDP + 2) == ROCEV2_UDP_PORT
        && h[BTH] == BTH_OPCODE_UD_SEND_ONLY
        && u32::from_be_bytes([h[TAG], h[TAG + 1], h[TAG + 2], h[TAG + 3]]) == INC_TAG_LOW;
    marked.then_some(h[5])
}

pub const IPV4_LEN: usize = Ipv4Hdr::LEN;
pub const UDP_LEN: usize = UdpHdr::LEN;
pub const BTH_LEN: usize = core::mem::size_of::<Bth>();
pub const DETH_LEN: usize = core::mem::size_of::<Deth>();
pub const INC_LEN: usize = core::mem::size_of::<IncHeader>();
pub const CONTROL_LEN: usize = core::mem::size_of::<ControlPayload>();
pub const ICRC_LEN: usize = 4;
/// UDP payload bytes before the INC payload (BTH + DETH + INC header).
pub const IB_HEADERS_LEN: usize = BTH_LEN + DETH_LEN + INC_LEN;
/// Offset of the INC payload in a frame whose IPv4 header has no options.
pub const PAYLOAD_OFFSET: usize = ETH_LEN + IPV4_LEN + UDP_LEN + IB_HEADERS_LEN;

const _: () = assert!(BTH_LEN == 12);
const _: () = assert!(DETH_LEN == 8);
const _: () = assert!(INC_LEN == 22, "the authors' packed INC_DATA is 22 bytes");
const _: () = assert!(CONTROL_LEN == 148);
const _: () = assert!(core::mem::size_of::<PathHop>() == 12);
const _: () = assert!(core::mem::align_of::<IncHeader>() == 1);
const _: () = assert!(core::mem::align_of::<ControlPayload>() == 1);

#[inline(always)]
const fn be16(b: [u8; 2]) -> u16 {
    u16::from_be_bytes(b)
}
#[inline(always)]
const fn be24(b: [u8; 3]) -> u32 {
    u32::from_be_bytes([0, b[0], b[1], b[2]])
}
#[inline(always)]
const fn be32(b: [u8; 4]) -> u32 {
    u32::from_be_bytes(b)
}
#[inline(always)]
const fn to_be24(v: u32) -> [u8; 3] {
    let b = v.to_be_bytes();
    [b[1], b[2], b[3]]
}

/// InfiniBand Base Transport Header (12 B).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bth {
    pub opcode: u8,
    /// SE (bit 7), MigReq (bit 6), PadCnt (bits 5–4), TVer (bits 3–0).
    pub flags: u8,
    pub pkey: [u8; 2],
    /// FECN/BECN and reserved bits; the ICRC treats this byte as all ones.
    pub resv8a: u8,
    pub dest_qp: [u8; 3],
    /// AckReq (bit 7) and reserved bits.
    pub ack_req: u8,
    pub psn: [u8; 3],
}

impl Bth {
    #[must_use]
    pub fn pkey(&self) -> u16 {
        be16(self.pkey)
    }
    #[must_use]
    pub fn dest_qp(&self) -> u32 {
        be24(self.dest_qp)
    }
    #[must_use]
    pub fn psn(&self) -> u32 {
        be24(self.psn)
    }
    /// Pad count: bytes of padding that make the payload a multiple of 4.
    #[must_use]
    pub fn pad_count(&self) -> u8 {
        (self.flags >> 4) & 0x3
    }
    pub fn set_dest_qp(&mut self, qp: u32) {
        self.dest_qp = to_be24(qp);
    }
    pub fn set_psn(&mut self, psn: u32) {
        self.psn = to_be24(psn);
    }
}

/// Datagram Extended Transport Header (8 B), present on UD packets.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deth {
    pub qkey: [u8; 4],
    pub rsvd: u8,
    pub src_qp: [u8; 3],
}

impl Deth {
    #[must_use]
    pub fn qkey(&self) -> u32 {
        be32(self.qkey)
    }
    #[must_use]
    pub fn src_qp(&self) -> u32 {
        be24(self.src_qp)
    }
    pub fn set_src_qp(&mut self, qp: u32) {
        self.src_qp = to_be24(qp);
    }
}

/// The INC ("MPI") header of the switch paper's Table 1, laid out as the authors' packed `INC_DATA`.
///
/// Group addressing: the authors' `rsv` u16 carries the upper 16 bits of innet's 24-bit
/// wire group id, `comm_id` the lower 8 — see [`IncHeader::group`]. The wire group id is the
/// low 24 bits of the control plane's random `true_comm_id`; `comm_id` 0xFF is reserved for
/// control packets, so group ids never end in 0xFF.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IncHeader {
    pub tag_low: [u8; 4],
    pub src_rank: [u8; 4],
    /// [`PacketKind`].
    pub data_flag: u8,
    pub comm_id: u8,
    /// Upper 16 bits of the wire group id (the authors' `rsv`).
    pub comm_id_hi: [u8; 2],
    /// [`crate::proto::Op`].
    pub op_code: u8,
    /// [`crate::proto::Dtype`].
    pub oper_and_type: u8,
    /// Aggregation round (per packet: every packet of a message has its own round).
    pub req_id: u8,
    /// Index of this packet inside its message (0-based, modulo 256).
    pub req_pkt_num: u8,
    /// Elements in this packet.
    pub pkt_para_num: [u8; 2],
    pub tag_high: [u8; 4],
}

impl IncHeader {
    #[inline(always)]
    #[must_use]
    pub fn tag_low(&self) -> u32 {
        be32(self.tag_low)
    }
    #[inline(always)]
    #[must_use]
    pub fn tag_high(&self) -> u32 {
        be32(self.tag_high)
    }
    #[inline(always)]
    #[must_use]
    pub fn src_rank(&self) -> u32 {
        be32(self.src_rank)
    }
    #[inline(always)]
    #[must_use]
    pub fn pkt_para_num(&self) -> u16 {
        be16(self.pkt_para_num)
    }
    #[inline(always)]
    #[must_use]
    pub fn kind(&self) -> Option<PacketKind> {
        PacketKind::from_u8(self.data_flag)
    }
    /// The 24-bit wire group id: `comm_id_hi << 8 | comm_id`.
    #[inline(always)]
    #[must_use]
    pub fn group(&self) -> u32 {
        (u32::from(be16(self.comm_id_hi)) << 8) | u32::from(self.comm_id)
    }
    /// Whether `comm_id` says "control packet".
    #[inline(always)]
    #[must_use]
    pub fn is_control_comm(&self) -> bool {
        self.comm_id == CONTROL_COMM_ID
    }
    pub fn set_group(&mut self, group: u32) {
        self.comm_id = group as u8;
        self.comm_id_hi = ((group >> 8) as u16).to_be_bytes();
    }
}

/// Control payload of query / notify / kill packets: the switch paper's Table 2 plus the authors'
/// non-core fields (`INC_SWITCH_QUERY`), then innet's `sup_window` (60 bytes), then the
/// switch path ([`ControlPath`], 88 bytes) that lets trees of any depth be set up.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ControlPayload {
    pub sup_mpi_type: [u8; 2],
    /// Why a switch refused the group (0 = none); see the control plane.
    pub fail_cause: u8,
    /// [`crate::proto::MASTER_NODE_MODE`] or [`crate::proto::MASTER_SOCKET_MODE`].
    pub master_num: u8,
    /// Bit 7: notify (answer); bits 0–6: switches crossed.
    pub query_notify_hop: u8,
    pub sup_comm_type: u8,
    /// Bitmap of supported [`crate::proto::Op`]s, intersected along the path.
    pub sup_allreduce_op: [u8; 2],
    /// Bitmap of supported [`crate::proto::Dtype`]s, intersected along the path.
    pub sup_data_type: [u8; 2],
    /// Largest payload per packet in bytes, minimum along the path.
    pub sup_max_data_size: [u8; 2],
    pub global_group_size: [u8; 2],
    pub local_group_size: [u8; 2],
    pub true_comm_id: [u8; 4],
    /// Free group capacity, written by SPINEs.
    pub ava_grp_num: [u8; 4],
    pub dst_rank: [u8; 4],
    pub tor1_ip: [u8; 4],
    pub spine_ip: [u8; 4],
    pub tor2_ip: [u8; 4],
    pub job_id: [u8; 8],
    pub c_id: [u8; 4],
    pub world_rank: [u8; 4],
    /// innet's addition: slots per group, minimum along the path; the leaders keep at most
    /// half as many rounds in flight.
    pub sup_window: [u8; 2],
    /// Reserved (zero).
    pub rsv: [u8; 2],
    /// innet's addition: the switches the packet concerns, see [`ControlPath`].
    pub path: ControlPath,
}

/// Hops a control path holds: a tree of depth `d` needs `2d - 1` for a notify (up the
/// MRR's branch, down the NMRR's), so 7 serve fabrics of up to 4 levels.
pub const MAX_PATH_HOPS: usize = 7;
/// The deepest fabric a control path describes (TOR = level 1).
pub const MAX_LEVELS: usize = MAX_PATH_HOPS.div_ceil(2);

/// The switch path of a control packet.
/// - Query (and climb): every switch it crosses on the way **up** appends itself with its
///   free group capacity (`hops[0]` is the sender's TOR); nothing is appended going down.
/// - Notify and kill: the path the packet takes through the group's tree: up the MRR's
///   branch to `hops[turn]` (where it meets the NMRR's branch), then down to the NMRR's TOR
///   (`hops[n_hops - 1]`). Each hop names its parent in the tree (0 at the root) and how
///   many children it has there.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ControlPath {
    pub n_hops: u8,
    /// Notify and kill: index of the hop where the packet turns down.
    pub turn: u8,
    /// Reserved (zero).
    pub rsv: [u8; 2],
    pub hops: [PathHop; MAX_PATH_HOPS],
}

/// One switch of a [`ControlPath`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathHop {
    pub ip: [u8; 4],
    /// Notify and kill: the switch's parent in the tree (0: it is the root).
    pub parent: [u8; 4],
    /// Query: the switch's free group capacity (saturating).
    pub free: [u8; 2],
    /// Notify: the switch's children in the tree (hosts or switches).
    pub children: u8,
    /// Query: how many uplinks the switch copied it to (0 at the top), so the MRR knows
    /// how many copies of each query and of its climb to expect.
    pub uplinks: u8,
}

impl PathHop {
    /// A query's hop: a switch, its free group capacity and its number of uplinks.
    #[must_use]
    pub fn seen(ip: u32, free: u32, uplinks: usize) -> Self {
        Self {
            ip: ip.to_be_bytes(),
            free: u16::try_from(free).unwrap_or(u16::MAX).to_be_bytes(),
            uplinks: u8::try_from(uplinks).unwrap_or(u8::MAX),
            ..Self::default()
        }
    }
    /// A notify's hop: a switch, its parent (0 at the root) and its number of children.
    #[must_use]
    pub fn in_tree(ip: u32, parent: u32, children: u8) -> Self {
        Self {
            ip: ip.to_be_bytes(),
            parent: parent.to_be_bytes(),
            children,
            ..Self::default()
        }
    }
    #[must_use]
    pub fn ip(&self) -> u32 {
        be32(self.ip)
    }
    #[must_use]
    pub fn parent(&self) -> u32 {
        be32(self.parent)
    }
    #[must_use]
    pub fn free(&self) -> u16 {
        be16(self.free)
    }
}

impl ControlPath {
    /// The valid hops.
    #[must_use]
    pub fn hops(&self) -> &[PathHop] {
        &self.hops[..usize::from(self.n_hops).min(MAX_PATH_HOPS)]
    }

    /// Appends a hop; `false` when the path is full.
    pub fn push(&mut self, hop: PathHop) -> bool {
        let n = usize::from(self.n_hops);
        if n >= MAX_PATH_HOPS {
            return false;
        }
        self.hops[n] = hop;
        self.n_hops += 1;
        true
    }

    /// Where `ip` sits on the path.
    #[must_use]
    pub fn position(&self, ip: u32) -> Option<usize> {
        self.hops().iter().position(|h| h.ip() == ip)
    }
}

/// Generates big-endian getters and setters for [`ControlPayload`] fields.
macro_rules! be_fields {
    ($($field:ident / $set:ident : $ty:ty),* $(,)?) => {
        impl ControlPayload {
            $(
                #[must_use]
                pub fn $field(&self) -> $ty {
                    <$ty>::from_be_bytes(self.$field)
                }
                pub fn $set(&mut self, v: $ty) {
                    self.$field = v.to_be_bytes();
                }
            )*
        }
    };
}

be_fields!(
    sup_mpi_type / set_sup_mpi_type: u16,
    sup_allreduce_op / set_sup_allreduce_op: u16,
    sup_data_type / set_sup_data_type: u16,
    sup_max_data_size / set_sup_max_data_size: u16,
    global_group_size / set_global_group_size: u16,
    local_group_size / set_local_group_size: u16,
    true_comm_id / set_true_comm_id: u32,
    ava_grp_num / set_ava_grp_num: u32,
    dst_rank / set_dst_rank: u32,
    tor1_ip / set_tor1_ip: u32,
    spine_ip / set_spine_ip: u32,
    tor2_ip / set_tor2_ip: u32,
    job_id / set_job_id: u64,
    c_id / set_c_id: u32,
    world_rank / set_world_rank: u32,
    sup_window / set_sup_window: u16,
);
