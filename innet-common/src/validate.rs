//! Validation of an INC header against the bytes that follow it. One definition for both
//! sides: the XDP classifier calls it on packet memory, the userspace parser on a slice, so
//! a frame that userspace rejects is rejected in the kernel for the same reason.

use crate::{
    proto::{Dtype, INC_TAG_HIGH, MAX_PAYLOAD_BYTES, Op, PacketKind, element_bytes},
    wire::{CONTROL_LEN, IncHeader},
};

/// Why a frame that carries the INC tag is not a valid INC packet. Each reason has its own
/// counter (`PortStats::mal_*`).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Malformed {
    /// The frame ends inside the INC header, payload or ICRC.
    Truncated = 0,
    /// IPv4/UDP lengths disagree with each other or with the frame.
    BadLength = 1,
    /// `tag_high` is not [`INC_TAG_HIGH`].
    BadTag = 2,
    /// Unknown `data_flag`, or `data_flag` and `comm_id` disagree on data vs control.
    BadKind = 3,
    /// Unknown `op_code`.
    BadOp = 4,
    /// Unknown `oper_and_type`.
    BadType = 5,
    /// `pkt_para_num` × element size differs from the payload length (or is zero).
    BadCount = 6,
    /// Payload longer than [`MAX_PAYLOAD_BYTES`].
    TooLarge = 7,
    /// A control packet whose payload is not exactly one `ControlPayload`.
    BadControl = 8,
    /// The first fragment of a datagram to UDP 4791, or a first UDP fragment too short to
    /// show its ports. RoCEv2 never fragments; a host would reassemble what the switch
    /// cannot read (the attack: a forged result split in two passes every member check).
    Fragment = 9,
    /// An INC packet behind a VLAN tag or after IPv4 options: the data path reads headers
    /// at fixed offsets, so it cannot member-check it, and a host's kernel strips both and
    /// would take the packet (the attack: options on a forged frame skip the switch).
    Layout = 10,
    /// An INC packet addressed to the switch's hand-off MAC ([`HANDOFF_MAC_PREFIX`]), which
    /// only a switch port's own emit program writes, on a result it passes to its tc
    /// fan-out (the attack: a forged result to that address would be fanned out to every
    /// child unchecked).
    ///
    /// [`HANDOFF_MAC_PREFIX`]: crate::wire::HANDOFF_MAC_PREFIX
    Handoff = 11,
}

impl Malformed {
    pub const ALL: [Self; 12] = [
        Self::Truncated,
        Self::BadLength,
        Self::BadTag,
        Self::BadKind,
        Self::BadOp,
        Self::BadType,
        Self::BadCount,
        Self::TooLarge,
        Self::BadControl,
        Self::Fragment,
        Self::Layout,
        Self::Handoff,
    ];

    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Truncated => "truncated",
            Self::BadLength => "bad_length",
            Self::BadTag => "bad_tag",
            Self::BadKind => "bad_kind",
            Self::BadOp => "bad_op",
            Self::BadType => "bad_type",
            Self::BadCount => "bad_count",
            Self::TooLarge => "too_large",
            Self::BadControl => "bad_control",
            Self::Fragment => "fragment",
            Self::Layout => "layout",
            Self::Handoff => "handoff",
        }
    }
}

/// What the XDP classifier makes of a frame (and what `codec::classify` predicts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Not IPv4/UDP to port 4791.
    NonRoce,
    /// RoCEv2, but not INC.
    RoceOther,
    IncData,
    IncControl,
    Malformed(Malformed),
}

/// A valid INC packet, as far as its header and length tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Data { op: Op, dtype: Dtype, count: u16 },
    Control(PacketKind),
}

/// Checks `hdr` against `body_len`, the bytes between the INC header and the ICRC.
///
/// The caller has already matched `tag_low` (that is what makes a frame INC at all).
///
/// # Errors
/// The first [`Malformed`] reason found, in the order of the header fields.
#[inline(always)]
pub fn validate_inc(hdr: &IncHeader, body_len: usize) -> Result<Verdict, Malformed> {
    if hdr.tag_high() != INC_TAG_HIGH {
        return Err(Malformed::BadTag);
    }
    let Some(kind) = hdr.kind() else {
        return Err(Malformed::BadKind);
    };
    if kind.is_control() != hdr.is_control_comm() {
        return Err(Malformed::BadKind);
    }
    if kind.is_control() {
        if body_len != CONTROL_LEN {
            return Err(Malformed::BadControl);
        }
        return Ok(Verdict::Control(kind));
    }
    let Some(op) = Op::from_u8(hdr.op_code) else {
        return Err(Malformed::BadOp);
    };
    let Some(dtype) = Dtype::from_u8(hdr.oper_and_type) else {
        return Err(Malformed::BadType);
    };
    if body_len > MAX_PAYLOAD_BYTES {
        return Err(Malformed::TooLarge);
    }
    let count = hdr.pkt_para_num();
    if count == 0 || usize::from(count) * element_bytes(op, dtype) != body_len {
        return Err(Malformed::BadCount);
    }
    Ok(Verdict::Data { op, dtype, count })
}
