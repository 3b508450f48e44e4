//! Protocol vocabulary: reduction operations, element types, packet kinds and the constants
//! that mark an INC packet. Numbering is innet's own (the switch paper publishes no values); the
//! capability bitmaps of the control payload use bit `1 << value`.

/// UDP destination port of RoCEv2.
pub const ROCEV2_UDP_PORT: u16 = 4791;
/// BTH opcode of an Unreliable Datagram `SEND Only` (IBTA: transport 0b011, op 0b00100).
pub const BTH_OPCODE_UD_SEND_ONLY: u8 = 0x64;
/// BTH transport header version (`TVer`) used by RoCEv2.
pub const BTH_TVER: u8 = 0;
/// Default partition key.
pub const BTH_PKEY_DEFAULT: u16 = 0xffff;
/// Queue pair number innet's UD traffic is addressed to (24 bits).
pub const INC_DEST_QP: u32 = 0x00_1c_c1;
/// Q_Key carried in DETH by every INC packet.
pub const INC_QKEY: u32 = 0x1c_c0_ff_ee;
/// First word of the INC header: ASCII "INC1". A RoCEv2 UD packet whose INC header starts
/// with anything else is "other RoCEv2" and is never touched.
pub const INC_TAG_LOW: u32 = 0x494e_4331;
/// Last word of the INC header: ASCII "MPIr". A packet with the right `tag_low` but the
/// wrong `tag_high` is counted as malformed INC.
pub const INC_TAG_HIGH: u32 = 0x4d50_4972;
/// `comm_id` of every control packet (query, notify, kill). Data packets never use it.
pub const CONTROL_COMM_ID: u8 = 0xff;
/// Wire group id of host-to-host packets (host allreduce algorithms, result recovery): never
/// installed on a switch, so every switch forwards them untouched.
pub const HOST_COMM_ID: u32 = 0;
/// BTH flag a switch sets on every packet it delivers to a host (results and replies): the
/// Solicited Event bit. A host accepts a data packet as a result only with it set, so a
/// contribution that reaches a host without being aggregated is never taken for a result.
pub const BTH_FLAG_RESULT: u8 = 0x80;
/// BTH flags bit (the MigReq bit, which innet otherwise leaves clear) of a **group-lost
/// notice**: a switch that meets INC data addressed to itself for a group it does not hold
/// turns the packet around to its sender with this bit set (and the result bit clear); a
/// switch that gets it from its parent passes it down to each child. A host takes it, like
/// any contribution of its group that comes back unaggregated, for "the group is gone".
pub const BTH_FLAG_LOST: u8 = 0x40;
/// Bytes of an IPv4 packet around its INC payload: IPv4 20 + UDP 8 + BTH 12 + DETH 8 +
/// INC 22 + ICRC 4.
pub const PAYLOAD_OVERHEAD: usize = 74;
/// The kernel's default MTU.
pub const STANDARD_MTU: usize = 1500;
/// The largest MTU a veth port takes while a single-buffer XDP program is attached: a
/// 4 KiB page less the XDP headroom (256), `skb_shared_info` (320) and Ethernet (14).
/// innet's programs declare `xdp.frags`, so its ports take larger ones; the jumbo
/// benchmarks and tests keep this MTU, where every packet still fits one buffer.
pub const VETH_XDP_MAX_MTU: usize = 3506;
/// Payload of one packet on a 1500 B MTU (the default): the largest multiple of 64 B whose
/// packet fits (1408 + 74 = 1482).
pub const DEFAULT_PAYLOAD_BYTES: usize = fits_mtu(STANDARD_MTU);
/// The MTU of jumbo-frame links (9000 B, what data-centre fabrics configure).
pub const JUMBO_MTU: usize = 9000;
/// Largest data payload of one packet, what a slot holds: 8 KiB, on links of 8266 B MTU or
/// more (a 9000 B jumbo frame would fit 8896 B; 8 KiB keeps a slot's memory a power of
/// two). A packet over [`SINGLE_BUFFER_PAYLOAD_BYTES`] spans several buffers on a veth
/// port (`xdp.frags`): the programs read and write it with `bpf_xdp_load_bytes` and
/// `bpf_xdp_store_bytes`, and fan its results out on the tc path (a devmap broadcast
/// refuses multi-buffer frames).
pub const MAX_PAYLOAD_BYTES: usize = 8192;
/// The largest payload whose packet fits a single XDP buffer on a veth port
/// ([`VETH_XDP_MAX_MTU`]).
pub const SINGLE_BUFFER_PAYLOAD_BYTES: usize = fits_mtu(VETH_XDP_MAX_MTU);
const _: () = assert!(
    DEFAULT_PAYLOAD_BYTES == 1408
        && fits_mtu(8266) == MAX_PAYLOAD_BYTES
        && SINGLE_BUFFER_PAYLOAD_BYTES == 3392
        && MAX_PAYLOAD_BYTES < fits_mtu(JUMBO_MTU)
);

/// The largest multiple of 64 B whose packet fits an IPv4 MTU of `mtu` (0 when not even
/// 64 B fit).
const fn fits_mtu(mtu: usize) -> usize {
    mtu.saturating_sub(PAYLOAD_OVERHEAD) / 64 * 64
}

/// The payload packets of a link with IPv4 MTU `mtu` carry: what fits, at most
/// [`MAX_PAYLOAD_BYTES`] (0 when not even 64 B fit).
#[must_use]
pub const fn payload_for_mtu(mtu: usize) -> usize {
    let fits = fits_mtu(mtu);
    if fits > MAX_PAYLOAD_BYTES {
        MAX_PAYLOAD_BYTES
    } else {
        fits
    }
}
/// The switch paper's (FPGA switch) payload limit, the default `sup_max_data_size`.
pub const SEED_MAX_PAYLOAD_BYTES: usize = 256;
/// Size of the location word that MINLOC/MAXLOC carry after each value (MPI: `int`).
pub const LOC_BYTES: usize = 4;

/// `data_flag` of the INC header: what the packet carries.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PacketKind {
    /// Reduction data of one round (`req_id`).
    Data = 0,
    /// Query: NMRR → MRR, switches fill in capabilities.
    Query = 1,
    /// Notify: MRR → NMRR, switches install the group.
    Notify = 2,
    /// Kill: MRR → NMRR, switches free the group.
    Kill = 3,
}

impl PacketKind {
    pub const ALL: [Self; 4] = [Self::Data, Self::Query, Self::Notify, Self::Kill];

    #[inline(always)]
    #[must_use]
    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::Data),
            1 => Some(Self::Query),
            2 => Some(Self::Notify),
            3 => Some(Self::Kill),
            _ => None,
        }
    }

    #[must_use]
    pub const fn is_control(self) -> bool {
        !matches!(self, Self::Data)
    }

    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Data => "data",
            Self::Query => "query",
            Self::Notify => "notify",
            Self::Kill => "kill",
        }
    }
}

/// `op_code` of the INC header: the MPI reduction operation.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Sum = 0,
    Prod = 1,
    Min = 2,
    Max = 3,
    Band = 4,
    Bor = 5,
    Bxor = 6,
    Land = 7,
    Lor = 8,
    Lxor = 9,
    Minloc = 10,
    Maxloc = 11,
}

impl Op {
    pub const ALL: [Self; 12] = [
        Self::Sum,
        Self::Prod,
        Self::Min,
        Self::Max,
        Self::Band,
        Self::Bor,
        Self::Bxor,
        Self::Land,
        Self::Lor,
        Self::Lxor,
        Self::Minloc,
        Self::Maxloc,
    ];

    #[inline(always)]
    #[must_use]
    pub const fn from_u8(v: u8) -> Option<Self> {
        if (v as usize) < Self::ALL.len() {
            Some(Self::ALL[v as usize])
        } else {
            None
        }
    }

    /// MINLOC/MAXLOC carry a location word after each value.
    #[inline(always)]
    #[must_use]
    pub const fn carries_location(self) -> bool {
        matches!(self, Self::Minloc | Self::Maxloc)
    }

    /// Whether MPI defines the op on `dtype`: every op on integers; on floats only SUM,
    /// PROD, MIN, MAX and the LOC pairs (bitwise and logical ops are not defined on them);
    /// on the half types not even the LOC pairs (MPI has no half pair types).
    #[inline(always)]
    #[must_use]
    pub const fn defined_on(self, dtype: Dtype) -> bool {
        if !dtype.is_float() {
            return true;
        }
        match self {
            Self::Sum | Self::Prod | Self::Min | Self::Max => true,
            Self::Minloc | Self::Maxloc => !dtype.is_half(),
            _ => false,
        }
    }

    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Sum => "sum",
            Self::Prod => "prod",
            Self::Min => "min",
            Self::Max => "max",
            Self::Band => "band",
            Self::Bor => "bor",
            Self::Bxor => "bxor",
            Self::Land => "land",
            Self::Lor => "lor",
            Self::Lxor => "lxor",
            Self::Minloc => "minloc",
            Self::Maxloc => "maxloc",
        }
    }
}

/// `oper_and_type` of the INC header: the element type.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    I8 = 0,
    I16 = 1,
    I32 = 2,
    I64 = 3,
    U8 = 4,
    U16 = 5,
    U32 = 6,
    U64 = 7,
    F32 = 8,
    F64 = 9,
    /// IEEE binary16 (`MPIX_C_FLOAT16`).
    F16 = 10,
    /// bfloat16: binary32's exponent, 7 fraction bits.
    BF16 = 11,
}

impl Dtype {
    pub const ALL: [Self; 12] = [
        Self::I8,
        Self::I16,
        Self::I32,
        Self::I64,
        Self::U8,
        Self::U16,
        Self::U32,
        Self::U64,
        Self::F32,
        Self::F64,
        Self::F16,
        Self::BF16,
    ];

    #[inline(always)]
    #[must_use]
    pub const fn from_u8(v: u8) -> Option<Self> {
        if (v as usize) < Self::ALL.len() {
            Some(Self::ALL[v as usize])
        } else {
            None
        }
    }

    /// Bytes of one value.
    #[inline(always)]
    #[must_use]
    pub const fn width(self) -> usize {
        match self {
            Self::I8 | Self::U8 => 1,
            Self::I16 | Self::U16 | Self::F16 | Self::BF16 => 2,
            Self::I32 | Self::U32 | Self::F32 => 4,
            Self::I64 | Self::U64 | Self::F64 => 8,
        }
    }

    /// The widest unsigned type whose width divides `bytes`: a bitwise op on a byte string
    /// (a broadcast, an allgather) gives the same bytes on any of them, and wider elements
    /// are fewer for the switches to combine.
    #[must_use]
    pub const fn bitwise_word(bytes: usize) -> Self {
        match bytes % 8 {
            0 => Self::U64,
            4 => Self::U32,
            2 | 6 => Self::U16,
            _ => Self::U8,
        }
    }

    /// Short name as in program names (`i8`, `u64`, `f32` …).
    #[must_use]
    pub const fn short(self) -> &'static str {
        match self {
            Self::I8 => "i8",
            Self::I16 => "i16",
            Self::I32 => "i32",
            Self::I64 => "i64",
            Self::U8 => "u8",
            Self::U16 => "u16",
            Self::U32 => "u32",
            Self::U64 => "u64",
            Self::F32 => "f32",
            Self::F64 => "f64",
            Self::F16 => "f16",
            Self::BF16 => "bf16",
        }
    }

    #[must_use]
    pub const fn is_signed(self) -> bool {
        matches!(self, Self::I8 | Self::I16 | Self::I32 | Self::I64)
    }

    #[must_use]
    pub const fn is_float(self) -> bool {
        matches!(self, Self::F32 | Self::F64 | Self::F16 | Self::BF16)
    }

    /// The 16-bit floats (float16, bfloat16).
    #[must_use]
    pub const fn is_half(self) -> bool {
        matches!(self, Self::F16 | Self::BF16)
    }

    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::I8 => "int8",
            Self::I16 => "int16",
            Self::I32 => "int32",
            Self::I64 => "int64",
            Self::U8 => "uint8",
            Self::U16 => "uint16",
            Self::U32 => "uint32",
            Self::U64 => "uint64",
            Self::F32 => "float32",
            Self::F64 => "float64",
            Self::F16 => "float16",
            Self::BF16 => "bfloat16",
        }
    }

    /// The type [`name`](Self::name) calls `name`.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.name() == name)
    }
}

/// Bytes one element occupies on the wire: the value, plus the `i32` location for
/// MINLOC/MAXLOC (MPI's `MPI_2INT`, `MPI_LONG_INT`, `MPI_DOUBLE_INT` … pair types).
#[inline(always)]
#[must_use]
pub const fn element_bytes(op: Op, dtype: Dtype) -> usize {
    if op.carries_location() {
        dtype.width() + LOC_BYTES
    } else {
        dtype.width()
    }
}

/// `query_notify_hop`: bit 7 set on answers (notify), bits 0–6 count switches crossed.
pub const QNH_RESPONSE: u8 = 0x80;
/// Mask of the hop count in `query_notify_hop`.
pub const QNH_HOPS_MASK: u8 = 0x7f;

/// `master_num` of the control payload (seed Table 2).
pub const MASTER_NODE_MODE: u8 = 0;
/// `master_num` of the control payload in Socket mode.
pub const MASTER_SOCKET_MODE: u8 = 1;
/// `master_num` of a NIC-triggered tree's handshake: the members' NICs reduce, so switches
/// forward its control packets untouched and install nothing.
pub const MASTER_NIC_MODE: u8 = 2;
/// `master_num` of a leader's request to its own DPU (a query: install my member of the
/// tree) and of the DPU's answer (a notify: what it offers, or why not). The DPU's program
/// hands these from the host's port to the DPU daemon, so they never cross the fabric when
/// a DPU daemon runs; the group's handshake itself then runs as [`MASTER_NIC_MODE`].
pub const MASTER_DPU_SETUP: u8 = 3;
/// `sup_comm_type`: the collective the group is for.
pub const COMM_TYPE_ALLREDUCE: u8 = 1;
/// `sup_comm_type` of a TOR probe: a query a host sends towards any other host to learn
/// which switch it hangs off. The first innet switch on the path (a TOR, on a host-facing
/// port) consumes it and answers the sender with a notify carrying its address in
/// `tor1_ip`; nothing is installed. A switch without innet passes it on, the other host
/// ignores it, and the prober's wait runs out: "no innet TOR".
pub const COMM_TYPE_PROBE: u8 = 2;
/// `sup_comm_type` of a climb: a query the MRR sends (addressed to any other leader) before
/// it collects its NMRRs' queries. Every switch copies it to each of its uplinks and
/// appends itself to its path; a switch with no uplink (the top of the fabric) sends it
/// back down to the MRR, with the addresses swapped. So the MRR learns the ways up from its
/// own TOR (with each switch's free capacity), and every switch on them learns on which
/// port the MRR and the switches above it are. Nothing is installed.
pub const COMM_TYPE_CLIMB: u8 = 3;

#[cfg(test)]
mod tests {
    use super::Dtype;

    #[test]
    fn every_element_type_is_found_by_its_name_and_nothing_else() {
        for d in Dtype::ALL {
            assert_eq!(Dtype::from_name(d.name()), Some(d));
        }
        assert_eq!(Dtype::from_name("double"), None);
        assert_eq!(Dtype::from_name(""), None);
    }
}
