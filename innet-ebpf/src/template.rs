//! The header that delivers a round's result to a child: the slot's saved packet addressed
//! to it, or the child's own packet turned around. Read by the XDP emit program and by the
//! tc fan-out alike.

use innet_common::{
    group::{MAX_CHILDREN, Slot, TEMPLATE_LEN},
    proto::{BTH_FLAG_RESULT, ROCEV2_UDP_PORT},
    wire::{ETH_LEN, IPV4_LEN, UDP_LEN},
};

const IP: usize = ETH_LEN;
const UDP: usize = ETH_LEN + IPV4_LEN;

/// Writes into `f` the header that delivers the result to child `j`: the saved packet that
/// was addressed to `j`, or else `j`'s own packet with source and destination swapped;
/// marked as a delivery.
#[inline(always)]
pub(crate) fn child_header(slot: &Slot, j: usize, f: &mut [u8; TEMPLATE_LEN]) -> bool {
    let (k, swapped) = template_of(slot, j);
    let t = &slot.templates[k];
    if t.valid == 0 {
        return false;
    }
    *f = t.bytes;
    if swapped {
        swap::<6>(f, 0, 6);
        swap::<4>(f, IP + 12, IP + 16);
        // RoCEv2 goes to UDP 4791 whatever port the sender used (its flow entropy).
        let port = ROCEV2_UDP_PORT.to_be_bytes();
        (f[UDP], f[UDP + 1], f[UDP + 2], f[UDP + 3]) = (f[UDP + 2], f[UDP + 3], port[0], port[1]);
    }
    mark_delivery(f);
    true
}

/// The template that delivers to child `j`: the first valid one addressed to `j`, else
/// `j`'s own (to be swapped, the second value). Arithmetic, no branch per template: in the
/// tc fan-out's loop over children, a branch each gave the verifier a path per child and
/// template to walk.
#[inline(always)]
fn template_of(slot: &Slot, j: usize) -> (usize, bool) {
    const NONE: u64 = MAX_CHILDREN as u64;
    let mut found = NONE;
    let mut k = 0;
    while k < MAX_CHILDREN {
        let t = &slot.templates[k];
        let take = u64::from(t.valid & 1)
            & is_zero(u64::from(t.dst_child) ^ j as u64)
            & is_zero(found ^ NONE);
        found ^= (found ^ k as u64) & take.wrapping_neg();
        k += 1;
    }
    let swapped = is_zero(found ^ NONE);
    found ^= (found ^ j as u64) & swapped.wrapping_neg();
    (found as usize & (MAX_CHILDREN - 1), swapped != 0)
}

/// 1 when `x` is 0, else 0, without a branch.
#[inline(always)]
fn is_zero(x: u64) -> u64 {
    1 ^ ((x | x.wrapping_neg()) >> 63)
}

#[inline(always)]
fn swap<const N: usize>(f: &mut [u8; TEMPLATE_LEN], a: usize, b: usize) {
    let mut i = 0;
    while i < N {
        f.swap(a + i, b + i);
        i += 1;
    }
}

/// A packet delivered to a child leaves as a result: the BTH's SE bit tells the host that a
/// switch computed it (a contribution that bypassed aggregation never carries it). RoCEv2
/// allows a zero UDP checksum; the original one no longer matches the payload.
#[inline(always)]
pub(crate) fn mark_delivery(f: &mut [u8; TEMPLATE_LEN]) {
    (f[UDP + 6], f[UDP + 7]) = (0, 0);
    f[UDP + UDP_LEN + 1] |= BTH_FLAG_RESULT;
}
