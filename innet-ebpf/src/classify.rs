//! Frame classification: non-RoCE, other RoCEv2, INC data, INC control, or malformed INC
//! with a reason. It mirrors `innet_common::codec::classify` step by step (the userspace
//! model the tests compare it with) and shares the INC header checks (`validate_inc`).
//!
//! It decides alone what the data path may read at fixed offsets: an INC packet in any
//! other layout (VLAN tags, IPv4 options) or in fragments is malformed, and switch ports
//! drop what is malformed, so nothing carrying a group's id passes unchecked.

use innet_common::{
    proto::{BTH_OPCODE_UD_SEND_ONLY, INC_TAG_LOW, ROCEV2_UDP_PORT},
    validate::{Class, Malformed, Verdict, validate_inc},
    wire::{
        BTH_LEN, Bth, DETH_LEN, ETH_LEN, ICRC_LEN, INC_LEN, IPV4_LEN, IncHeader, Ipv4Hdr,
        MAX_VLAN_TAGS, UDP_LEN, UdpHdr, VLAN_TAG_LEN, is_handoff_mac, is_vlan_ethertype,
    },
};

use crate::parse::{Packet, frame_len, ptr_at};

const ETHERTYPE_IPV4: u16 = 0x0800;
pub const IPPROTO_UDP: u8 = 17;
/// Of the IPv4 flags-and-offset field: the fragment offset.
pub const IPV4_FRAGMENT_OFFSET: u16 = 0x1fff;
/// The fragment offset and the more-fragments flag: any bit set makes a fragment.
pub const IPV4_FRAGMENT: u16 = 0x2000 | IPV4_FRAGMENT_OFFSET;
/// UDP length of an INC packet with an empty body and no padding.
const MIN_INC_UDP_LEN: usize = UDP_LEN + BTH_LEN + DETH_LEN + INC_LEN + ICRC_LEN;

#[inline(always)]
pub fn classify(ctx: &impl Packet) -> Class {
    match try_classify(ctx) {
        Ok(class) | Err(class) => class,
    }
}

/// `Err` carries an early verdict, so each step reads as one line with `?`.
#[inline(always)]
fn try_classify(ctx: &impl Packet) -> Result<Class, Class> {
    // Read first: a check at offset 0 after the later ones would be folded into them by the
    // compiler, and the verifier then sees a read through an unchecked pointer.
    let dst_mac: *const [u8; 6] = ptr_at(ctx, 0).ok_or(Class::NonRoce)?;
    // SAFETY: ptr_at checked the bounds.
    let dst_mac = unsafe { *dst_mac };
    let l3 = after_vlan_tags(ctx)?;
    let ip: *const Ipv4Hdr = ptr_at(ctx, l3).ok_or(Class::NonRoce)?;
    // SAFETY: ptr_at checked the bounds.
    let ip = unsafe { &*ip };
    if ip.vihl >> 4 != 4 {
        return Err(Class::NonRoce);
    }
    let ip_len = usize::from(ip.vihl & 0xf) * 4;
    if ip_len < IPV4_LEN {
        return Err(Class::NonRoce);
    }
    let len = frame_len(ctx);
    if len < l3 + ip_len {
        return Err(Class::NonRoce);
    }
    let udp_off = l3 + ip_len;
    if u16::from_be_bytes(ip.frags) & IPV4_FRAGMENT != 0 {
        return Err(fragment(ctx, ip, ip_len, udp_off));
    }
    if ip.proto != IPPROTO_UDP {
        return Err(Class::NonRoce);
    }
    let udp: *const UdpHdr = ptr_at(ctx, udp_off).ok_or(Class::NonRoce)?;
    let udp = unsafe { &*udp };
    if u16::from_be_bytes(udp.dst) != ROCEV2_UDP_PORT {
        return Err(Class::NonRoce);
    }

    let bth_off = udp_off + UDP_LEN;
    let bth: *const Bth = ptr_at(ctx, bth_off).ok_or(Class::RoceOther)?;
    let bth = unsafe { &*bth };
    if bth.opcode != BTH_OPCODE_UD_SEND_ONLY {
        return Err(Class::RoceOther);
    }
    let inc_off = bth_off + BTH_LEN + DETH_LEN;
    let tag: *const [u8; 4] = ptr_at(ctx, inc_off).ok_or(Class::RoceOther)?;
    if u32::from_be_bytes(unsafe { *tag }) != INC_TAG_LOW {
        return Err(Class::RoceOther);
    }

    // Tagged INC from here on: every failure is a counted rejection.
    let inc: *const IncHeader =
        ptr_at(ctx, inc_off).ok_or(Class::Malformed(Malformed::Truncated))?;
    let inc = unsafe { &*inc };
    // Attack: a forged result with IPv4 options (or a VLAN 0 tag) would skip the data
    // path, which reads at fixed offsets, and a host's kernel strips both and takes it.
    if l3 != ETH_LEN || ip_len != IPV4_LEN {
        return Err(Class::Malformed(Malformed::Layout));
    }
    // Attack: a forged result addressed to the hand-off MAC would be fanned out to every
    // child by the port's tc program, which takes that address as the emit program's mark.
    if is_handoff_mac(&dst_mac) {
        return Err(Class::Malformed(Malformed::Handoff));
    }
    let bad_length = Class::Malformed(Malformed::BadLength);
    let udp_len = usize::from(u16::from_be_bytes(udp.len));
    if usize::from(u16::from_be_bytes(ip.tot_len)) != ip_len + udp_len || udp_len < MIN_INC_UDP_LEN
    {
        return Err(bad_length);
    }
    let pad = usize::from(bth.pad_count());
    if udp_len < MIN_INC_UDP_LEN + pad {
        return Err(bad_length);
    }
    if len < udp_off + udp_len {
        return Err(Class::Malformed(Malformed::Truncated));
    }
    let body_len = udp_len - MIN_INC_UDP_LEN - pad;
    match validate_inc(inc, body_len) {
        Ok(Verdict::Data { .. }) => Ok(Class::IncData),
        Ok(Verdict::Control(_)) => Ok(Class::IncControl),
        Err(reason) => Err(Class::Malformed(reason)),
    }
}

/// Where the IPv4 header starts, past up to `MAX_VLAN_TAGS` VLAN tags; `Err` for a frame
/// that is not IPv4 or hides under more tags (dropped: a host peels VLAN 0 tags one by one).
#[inline(always)]
pub fn after_vlan_tags(ctx: &impl Packet) -> Result<usize, Class> {
    let mut l3 = ETH_LEN;
    let mut i = 0;
    while i <= MAX_VLAN_TAGS {
        let ether_type: *const [u8; 2] = ptr_at(ctx, l3 - 2).ok_or(Class::NonRoce)?;
        // SAFETY: ptr_at checked the bounds.
        let ether_type = u16::from_be_bytes(unsafe { *ether_type });
        if ether_type == ETHERTYPE_IPV4 {
            return Ok(l3);
        }
        if !is_vlan_ethertype(ether_type) {
            return Err(Class::NonRoce);
        }
        l3 += VLAN_TAG_LEN;
        i += 1;
    }
    Err(Class::Malformed(Malformed::Layout))
}

/// An IPv4 fragment: the first one of a datagram to UDP 4791, or a first UDP fragment too
/// short to show its ports, is dropped (attack: a forged INC packet in fragments, which the
/// data path never sees whole and a host reassembles); every other fragment passes.
#[inline(always)]
fn fragment(ctx: &impl Packet, ip: &Ipv4Hdr, ip_len: usize, udp_off: usize) -> Class {
    if u16::from_be_bytes(ip.frags) & IPV4_FRAGMENT_OFFSET != 0 || ip.proto != IPPROTO_UDP {
        return Class::NonRoce;
    }
    let Some(udp) = ptr_at::<UdpHdr>(ctx, udp_off) else {
        return Class::Malformed(Malformed::Fragment);
    };
    if usize::from(u16::from_be_bytes(ip.tot_len)) < ip_len + UDP_LEN {
        return Class::Malformed(Malformed::Fragment);
    }
    // SAFETY: ptr_at checked the bounds.
    if u16::from_be_bytes(unsafe { (*udp).dst }) == ROCEV2_UDP_PORT {
        Class::Malformed(Malformed::Fragment)
    } else {
        Class::NonRoce
    }
}
