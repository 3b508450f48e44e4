//! Frame classification: non-RoCE, other RoCEv2, INC data, INC control, or malformed INC
//! with a reason. It mirrors `innet_common::codec::classify` step by step (the userspace
//! model the tests compare it with) and shares the INC header checks (`validate_inc`).

use innet_common::{
    proto::{BTH_OPCODE_UD_SEND_ONLY, INC_TAG_LOW, ROCEV2_UDP_PORT},
    validate::{Class, Malformed, Verdict, validate_inc},
    wire::{
        BTH_LEN, Bth, DETH_LEN, ETH_LEN, EthHdr, ICRC_LEN, INC_LEN, IPV4_LEN, IncHeader, Ipv4Hdr,
        UDP_LEN, UdpHdr,
    },
};

use crate::parse::{Packet, frame_len, ptr_at};

const ETHERTYPE_IPV4: u16 = 0x0800;
const IPPROTO_UDP: u8 = 17;
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
    let eth: *const EthHdr = ptr_at(ctx, 0).ok_or(Class::NonRoce)?;
    // SAFETY: ptr_at checked the bounds.
    if u16::from_be(unsafe { (*eth).ether_type }) != ETHERTYPE_IPV4 {
        return Err(Class::NonRoce);
    }
    let ip: *const Ipv4Hdr = ptr_at(ctx, ETH_LEN).ok_or(Class::NonRoce)?;
    let ip = unsafe { &*ip };
    if ip.vihl >> 4 != 4 {
        return Err(Class::NonRoce);
    }
    let ip_len = usize::from(ip.vihl & 0xf) * 4;
    if ip_len < IPV4_LEN {
        return Err(Class::NonRoce);
    }
    let len = frame_len(ctx);
    if len < ETH_LEN + ip_len {
        return Err(Class::NonRoce);
    }
    if u16::from_be_bytes(ip.frags) & 0x3fff != 0 || ip.proto != IPPROTO_UDP {
        return Err(Class::NonRoce);
    }
    let udp_off = ETH_LEN + ip_len;
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
