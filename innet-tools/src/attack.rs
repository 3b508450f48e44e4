//! Frames a host outside a job forges against it (issue 44): the hostile tests and the
//! campaign's `hostile` rows send these from a namespace of their own, through a packet
//! socket, with any source address they like. Wire ids are not secrets here: every forgery
//! knows the job's group id, and the host frames know its partition key.

use std::net::Ipv4Addr;

use innet_client::frames;
use innet_common::{
    codec::{Addressing, data_header, encode, encode_control, ipv4_checksum},
    proto::{BTH_FLAG_RESULT, Dtype, HOST_COMM_ID, Op, PacketKind},
    wire::{
        ControlPayload, ETH_LEN, HANDOFF_EXCLUDE_INGRESS, HANDOFF_MAC_PREFIX, IPV4_LEN, UDP_LEN,
    },
};

use innet_lab::bpf::data_frame;

/// Where a frame's BTH flags byte sits (SE: the result bit).
const BTH_FLAGS: usize = ETH_LEN + IPV4_LEN + UDP_LEN + 1;
/// A source MAC the attacker uses (locally administered).
pub const ATTACKER_MAC: [u8; 6] = [2, 0xa7, 0, 0, 0, 1];
/// Every host's MAC as far as a forger cares: the bridge floods it, and a host's kernel
/// takes unicast IPv4 in a broadcast frame.
pub const ANY_MAC: [u8; 6] = [0xff; 6];

/// How an attacker dresses a forged frame so that a switch reading fixed offsets would not
/// parse it while a member's kernel still takes it (issue 44, item 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disguise {
    /// None: the plain frame, which the switch always member-checked.
    Plain,
    /// 4 bytes of IPv4 options (IHL 6).
    IpOptions,
    /// A VLAN 0 (priority) tag, which a host's kernel takes as untagged.
    Vlan0,
    /// Two IPv4 fragments, which a host's kernel reassembles.
    Fragments,
    /// Addressed to the hand-off MAC a switch port marks the results it passes to its own tc
    /// fan-out with, which would send a copy to every child.
    HandoffMac,
}

impl Disguise {
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::IpOptions => "IPv4 options",
            Self::Vlan0 => "VLAN 0 tag",
            Self::Fragments => "IPv4 fragments",
            Self::HandoffMac => "hand-off MAC",
        }
    }
}

/// A data frame of group `id` from `src` to `dst` for round `round`: a contribution, or with
/// `result` a result (SE set).
#[must_use]
pub fn forged_data(id: u32, src: Ipv4Addr, dst: Ipv4Addr, round: u8, result: bool) -> Vec<u8> {
    let mut f = data_frame(
        id,
        0,
        (src, ATTACKER_MAC),
        (dst, ANY_MAC),
        u32::from(round),
        (Op::Sum, Dtype::I32),
        &[0x55; 64],
    );
    if result {
        f[BTH_FLAGS] |= BTH_FLAG_RESULT;
    }
    f
}

/// A control frame (`kind`, as rank `rank`) from `src` to `dst` with body `body`.
#[must_use]
pub fn forged_control(
    kind: PacketKind,
    (src, dst): (Ipv4Addr, Ipv4Addr),
    rank: u32,
    body: &ControlPayload,
) -> Vec<u8> {
    let addr = Addressing {
        src_mac: ATTACKER_MAC,
        dst_mac: ANY_MAC,
        src_ip: src,
        dst_ip: dst,
        ..Addressing::default()
    };
    encode_control(&addr, kind, rank, body)
}

/// A host-to-host frame of the job with partition key `pkey`, as leader `src_rank` at
/// `src` would send it to `dst`: collective `seq`, step `step`, packet `psn`, body `body`
/// (bytes).
#[must_use]
pub fn forged_host_frame(
    pkey: u16,
    (src_rank, src): (u32, Ipv4Addr),
    dst: Ipv4Addr,
    (seq, step): (u32, u8),
    psn: u32,
    body: &[u8],
) -> Vec<u8> {
    let addr = Addressing {
        pkey,
        src_mac: ATTACKER_MAC,
        dst_mac: ANY_MAC,
        ..frames::addressing(src, dst, psn, seq)
    };
    let count = u16::try_from(body.len()).expect("a packet's body");
    let hdr = data_header(
        HOST_COMM_ID,
        src_rank,
        Op::Sum,
        Dtype::U8,
        step,
        psn as u8,
        count,
    );
    encode(&addr, &hdr, body)
}

/// `frame` (untagged, IHL 5) dressed up as `disguise`: the frames to send, each with a valid
/// IPv4 checksum (`ip_id` numbers the fragments' datagram).
#[must_use]
pub fn disguised(frame: &[u8], disguise: Disguise, ip_id: u16) -> Vec<Vec<u8>> {
    const IP: usize = ETH_LEN;
    let fix_checksum = |f: &mut Vec<u8>, ihl: usize| {
        f[IP + 10..IP + 12].fill(0);
        let c = ipv4_checksum(&f[IP..IP + ihl]);
        f[IP + 10..IP + 12].copy_from_slice(&c.to_be_bytes());
    };
    match disguise {
        Disguise::Plain => vec![frame.to_vec()],
        Disguise::IpOptions => {
            let mut f = frame.to_vec();
            f.splice(IP + IPV4_LEN..IP + IPV4_LEN, [1, 1, 1, 0]); // NOP NOP NOP EOL
            f[IP] = 0x46;
            let total = u16::from_be_bytes([f[IP + 2], f[IP + 3]]) + 4;
            f[IP + 2..IP + 4].copy_from_slice(&total.to_be_bytes());
            fix_checksum(&mut f, IPV4_LEN + 4);
            vec![f]
        }
        Disguise::Vlan0 => {
            let mut f = frame.to_vec();
            f.splice(12..12, [0x81, 0x00, 0x00, 0x00]);
            vec![f]
        }
        Disguise::HandoffMac => {
            let mut f = frame.to_vec();
            f[..5].copy_from_slice(&HANDOFF_MAC_PREFIX);
            f[5] = HANDOFF_EXCLUDE_INGRESS;
            vec![f]
        }
        Disguise::Fragments => {
            let payload = &frame[IP + IPV4_LEN..];
            // A multiple of 8: the UDP header and the first half of the BTH.
            let split = 16;
            let piece = |range: std::ops::Range<usize>, frag: u16| {
                let mut f = frame[..IP + IPV4_LEN].to_vec();
                f.extend_from_slice(&payload[range.clone()]);
                let total = (IPV4_LEN + range.len()) as u16;
                f[IP + 2..IP + 4].copy_from_slice(&total.to_be_bytes());
                f[IP + 4..IP + 6].copy_from_slice(&ip_id.to_be_bytes());
                f[IP + 6..IP + 8].copy_from_slice(&frag.to_be_bytes());
                fix_checksum(&mut f, IPV4_LEN);
                f
            };
            vec![
                piece(0..split, 0x2000),
                piece(split..payload.len(), split as u16 / 8),
            ]
        }
    }
}

#[cfg(test)]
mod tests {
    use innet_common::{
        codec::{Class, classify},
        validate::Malformed,
    };

    use super::*;

    #[test]
    fn each_disguise_is_what_the_classifier_refuses() {
        let f = forged_data(
            0x42,
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(10, 0, 0, 2),
            3,
            true,
        );
        assert_eq!(
            classify(&disguised(&f, Disguise::Plain, 1)[0]),
            Class::IncData
        );
        for d in [Disguise::IpOptions, Disguise::Vlan0] {
            let out = disguised(&f, d, 1);
            assert_eq!(out.len(), 1);
            assert_eq!(
                classify(&out[0]),
                Class::Malformed(Malformed::Layout),
                "{d:?}"
            );
            let ip = if d == Disguise::Vlan0 {
                ETH_LEN + 4
            } else {
                ETH_LEN
            };
            let ihl = usize::from(out[0][ip] & 0xf) * 4;
            assert_eq!(ipv4_checksum(&out[0][ip..ip + ihl]), 0, "{d:?}: checksum");
        }
        assert_eq!(
            classify(&disguised(&f, Disguise::HandoffMac, 1)[0]),
            Class::Malformed(Malformed::Handoff)
        );
        let pieces = disguised(&f, Disguise::Fragments, 7);
        assert_eq!(classify(&pieces[0]), Class::Malformed(Malformed::Fragment));
        assert_eq!(
            classify(&pieces[1]),
            Class::NonRoce,
            "a later fragment passes"
        );
        let total: usize = pieces.iter().map(|p| p.len() - ETH_LEN - IPV4_LEN).sum();
        assert_eq!(
            total,
            f.len() - ETH_LEN - IPV4_LEN,
            "the pieces hold the datagram"
        );
    }
}
