//! The rest of a datagram whose first fragment was dropped. The classifier drops the first
//! fragment of any datagram to UDP 4791 (`mal_fragment`): a forged INC packet in fragments
//! is never seen whole here, and a member's kernel would reassemble it. Its later fragments
//! carry no UDP header, so the classifier passes them as ordinary traffic; they would still
//! travel to the member, whose kernel queues them for reassembly until it gives up (30 s),
//! at the cost of the member's CPU and memory (the hostile campaign's fragment rows, 0.71×
//! at three levels). The first fragment's datagram is remembered here for a while and its
//! later fragments are dropped too (`later_fragments_dropped`).

use aya_ebpf::helpers::bpf_ktime_get_ns;
use innet_common::wire::Ipv4Hdr;

use crate::{
    classify::{IPPROTO_UDP, IPV4_FRAGMENT, IPV4_FRAGMENT_OFFSET, after_vlan_tags},
    maps::{DROPPED_DATAGRAMS, Datagram},
    parse::{Packet, ptr_at},
};

/// How long a dropped first fragment's datagram is remembered: longer than its fragments
/// take to follow it, far shorter than an IPv4 id takes to come round again between two
/// hosts.
const REMEMBER_NS: u64 = 1_000_000_000;

/// The fragment's IPv4 header and its offset field (flags masked off), if the frame is an
/// IPv4 UDP fragment.
#[inline(always)]
fn udp_fragment(ctx: &impl Packet) -> Option<(Datagram, u16)> {
    let l3 = after_vlan_tags(ctx).ok()?;
    let ip = ptr_at::<Ipv4Hdr>(ctx, l3)?;
    // SAFETY: ptr_at checked the bounds.
    let ip = unsafe { &*ip };
    let frags = u16::from_be_bytes(ip.frags);
    if ip.proto != IPPROTO_UDP || frags & IPV4_FRAGMENT == 0 {
        return None;
    }
    let d = Datagram::of(ip.src_addr, ip.dst_addr, ip.id, ip.proto);
    Some((d, frags & IPV4_FRAGMENT_OFFSET))
}

/// Remembers the datagram of a first fragment the classifier dropped.
#[inline(always)]
pub fn dropped_first(ctx: &impl Packet) {
    if let Some((d, 0)) = udp_fragment(ctx) {
        // SAFETY: plain helper call.
        let now = unsafe { bpf_ktime_get_ns() };
        let _ = DROPPED_DATAGRAMS.insert(&d, &now, 0);
    }
}

/// Whether a fragment the classifier passes belongs to a datagram whose first fragment was
/// dropped here lately (drop it too). A first fragment that passes forgets its datagram.
/// Attack: a host forges a first fragment to UDP 4791 with two other hosts' addresses and
/// the id of their next fragmented datagram, so that its later fragments are dropped; the
/// real datagram's first fragment, which passes before them, clears the entry.
#[inline(always)]
pub fn of_dropped(ctx: &impl Packet) -> bool {
    let Some((d, offset)) = udp_fragment(ctx) else {
        return false;
    };
    if offset == 0 {
        let _ = DROPPED_DATAGRAMS.remove(&d);
        return false;
    }
    // SAFETY: read only; a racing update only moves the time.
    let Some(&at) = (unsafe { DROPPED_DATAGRAMS.get(&d) }) else {
        return false;
    };
    // SAFETY: plain helper call.
    unsafe { bpf_ktime_get_ns() }.wrapping_sub(at) < REMEMBER_NS
}
