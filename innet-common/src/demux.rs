//! Which INC socket of a host address a datagram belongs to.
//!
//! Every communicator's leader has its own INC socket, yet RoCEv2 fixes the UDP port (4791),
//! so communicators whose leaders share an address (an `MPI_Comm_dup`, the row and column
//! communicators of a 2-D decomposition, ranks of several processes on one node) bind one
//! `SO_REUSEPORT` group there. The `innet_inc_socket` sk_reuseport program reads a key out of
//! each datagram and hands it to the socket registered under that key, as a NIC hands a
//! packet to its queue pair. The program and the client compute the key here, from the same
//! bytes:
//! - in-network data and results: the group's wire id (24 bits);
//! - control packets (query, notify, kill): the low 24 bits of their `true_comm_id`, which is
//!   that same wire id;
//! - host-to-host packets (wire group [`HOST_COMM_ID`]): the job's BTH partition key, tagged
//!   with [`HOST_KEY_FLAG`] so the two key spaces never meet.

use crate::{
    proto::{CONTROL_COMM_ID, HOST_COMM_ID, PacketKind},
    wire::{BTH_LEN, Bth, ControlPayload, DETH_LEN, INC_LEN, IncHeader, UDP_LEN},
};

/// The bytes, from the UDP header on, that every INC datagram carries (UDP, BTH, DETH, INC).
pub const HEAD_LEN: usize = UDP_LEN + BTH_LEN + DETH_LEN + INC_LEN;
/// Offset, from the UDP header, of a control packet's `true_comm_id` (big endian).
pub const CONTROL_COMM_OFFSET: usize =
    HEAD_LEN + core::mem::offset_of!(ControlPayload, true_comm_id);
/// Marks a host-to-host key (partition keys are 16 bits, wire ids 24).
pub const HOST_KEY_FLAG: u32 = 1 << 31;
/// Sockets one address can share (entries of the selector's socket array).
pub const MAX_SOCKETS: u32 = 64;
/// Keys the selector can hold: three per socket (its job's host packets, its group's
/// id, and the id its group would be set up again under).
pub const MAX_KEYS: u32 = 3 * MAX_SOCKETS;
/// The selector's maps (pinned per address, shared by every process that binds there).
pub const SOCKETS_MAP: &str = "INC_SOCKETS";
pub const KEYS_MAP: &str = "INC_SOCKET_KEYS";
/// The sk_reuseport program.
pub const PROG_SELECT: &str = "innet_inc_socket";

const INC_OFFSET: usize = UDP_LEN + BTH_LEN + DETH_LEN;
const KIND: usize = INC_OFFSET + core::mem::offset_of!(IncHeader, data_flag);
const COMM_ID: usize = INC_OFFSET + core::mem::offset_of!(IncHeader, comm_id);
const COMM_ID_HI: usize = INC_OFFSET + core::mem::offset_of!(IncHeader, comm_id_hi);
const PKEY: usize = UDP_LEN + core::mem::offset_of!(Bth, pkey);

/// Where a datagram's key is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// In its head.
    Key(u32),
    /// In a control payload: [`comm_key`] of the 4 bytes at [`CONTROL_COMM_OFFSET`].
    ControlComm,
    /// Not an INC packet this selector knows: any socket may have it (and will drop it).
    Unknown,
}

/// The key of a communicator's in-network and control packets.
#[inline(always)]
#[must_use]
pub const fn comm_key(true_comm_id: u32) -> u32 {
    true_comm_id & 0x00ff_ffff
}

/// The key of a job's host-to-host packets.
#[inline(always)]
#[must_use]
pub const fn host_key(pkey: u16) -> u32 {
    HOST_KEY_FLAG | pkey as u32
}

/// Reads the key of a datagram from its first [`HEAD_LEN`] bytes (UDP header included).
#[inline(always)]
#[must_use]
pub fn key_source(head: &[u8; HEAD_LEN]) -> KeySource {
    let group = u32::from(u16::from_be_bytes([head[COMM_ID_HI], head[COMM_ID_HI + 1]])) << 8
        | u32::from(head[COMM_ID]);
    match PacketKind::from_u8(head[KIND]) {
        Some(PacketKind::Data) if group == HOST_COMM_ID => {
            KeySource::Key(host_key(u16::from_be_bytes([head[PKEY], head[PKEY + 1]])))
        }
        Some(PacketKind::Data) if head[COMM_ID] != CONTROL_COMM_ID => KeySource::Key(group),
        Some(kind) if kind.is_control() => KeySource::ControlComm,
        _ => KeySource::Unknown,
    }
}

#[cfg(all(test, feature = "user"))]
mod tests {
    use std::vec::Vec;

    use super::*;
    use crate::{
        codec::{Addressing, data_header, encode, encode_control},
        proto::{Dtype, Op},
        wire::{ETH_LEN, IPV4_LEN},
    };

    fn key_of(frame: &[u8]) -> Option<u32> {
        let udp: Vec<u8> = frame[ETH_LEN + IPV4_LEN..].to_vec();
        let head: &[u8; HEAD_LEN] = udp[..HEAD_LEN].try_into().ok()?;
        match key_source(head) {
            KeySource::Key(k) => Some(k),
            KeySource::ControlComm => {
                let b = &udp[CONTROL_COMM_OFFSET..CONTROL_COMM_OFFSET + 4];
                Some(comm_key(u32::from_be_bytes(b.try_into().unwrap())))
            }
            KeySource::Unknown => None,
        }
    }

    #[test]
    fn data_and_results_are_keyed_by_their_wire_group() {
        let hdr = data_header(0x12_3456, 3, Op::Sum, Dtype::I32, 5, 0, 4);
        let frame = encode(&Addressing::default(), &hdr, &[0u8; 16]);
        assert_eq!(key_of(&frame), Some(0x12_3456));
    }

    #[test]
    fn host_packets_are_keyed_by_their_partition_key() {
        let hdr = data_header(HOST_COMM_ID, 1, Op::Sum, Dtype::I32, 2, 0, 0);
        let addr = Addressing {
            pkey: 0x9abc,
            ..Addressing::default()
        };
        let frame = encode(&addr, &hdr, &[]);
        assert_eq!(key_of(&frame), Some(HOST_KEY_FLAG | 0x9abc));
        assert_ne!(
            host_key(0x3456),
            comm_key(0x3456),
            "the key spaces never meet"
        );
    }

    #[test]
    fn control_packets_are_keyed_by_their_communicator() {
        for kind in [PacketKind::Query, PacketKind::Notify, PacketKind::Kill] {
            let mut c = ControlPayload::default();
            c.set_true_comm_id(0xa712_3456);
            let frame = encode_control(&Addressing::default(), kind, 0, &c);
            assert_eq!(key_of(&frame), Some(comm_key(0xa712_3456)), "{kind:?}");
        }
    }

    #[test]
    fn other_bytes_have_no_key() {
        let mut head = [0u8; HEAD_LEN];
        head[KIND] = 9;
        assert_eq!(key_source(&head), KeySource::Unknown);
        head[KIND] = PacketKind::Data as u8;
        head[COMM_ID] = CONTROL_COMM_ID;
        assert_eq!(key_source(&head), KeySource::Unknown);
    }
}
