//! RoCEv2 ICRC in BPF (no CRC helper exists): table CRC-32 over the frame from the IPv4
//! header to the ICRC, with the variant fields read as ones — byte by byte over the headers
//! that hold them, eight bytes a step (slicing-by-8) over the rest (see
//! `innet_common::icrc` for the definition and its test against an independent CRC).

use aya_ebpf::{
    helpers::{bpf_xdp_load_bytes, bpf_xdp_store_bytes},
    programs::XdpContext,
};
use innet_common::{
    group::{ICRC_SEED, TEMPLATE_LEN, crc32_combine, crc32_step1, crc32_step8},
    wire::{ETH_LEN, IPV4_LEN, UDP_LEN},
};

use crate::{
    maps::{MAX_FRAME, SCRATCH},
    parse::helper_len,
};

/// Offsets (in a frame without IPv4 options) of the bytes the ICRC masks to 0xFF:
/// IPv4 TOS, TTL, checksum; UDP checksum; BTH resv8a.
#[inline(always)]
fn masked(off: usize) -> bool {
    const IP: usize = ETH_LEN;
    const UDP: usize = ETH_LEN + IPV4_LEN;
    matches!(off.wrapping_sub(IP), 1 | 8 | 10 | 11) || matches!(off.wrapping_sub(UDP), 6 | 7 | 12)
}

/// Computes the ICRC of the frame and writes it into its last 4 bytes. Returns false for
/// frames outside the sizes innet emits.
#[inline(always)]
pub fn write_icrc(ctx: &XdpContext, frame_len: usize) -> bool {
    if !(ETH_LEN + 8..=MAX_FRAME).contains(&frame_len) {
        return false;
    }
    let Some(scratch) = SCRATCH.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: this CPU's scratch buffer.
    let buf = unsafe { &mut (*scratch).bytes };
    let Some(len) = helper_len(frame_len, MAX_FRAME) else {
        return false;
    };
    // SAFETY: buf holds MAX_FRAME bytes and len <= MAX_FRAME.
    if unsafe { bpf_xdp_load_bytes(ctx.ctx, 0, buf.as_mut_ptr().cast(), len) } != 0 {
        return false;
    }
    let icrc_off = frame_len - 4;
    let mut crc = ICRC_SEED;
    let mut off = ETH_LEN;
    // The masked bytes all lie before the BTH's second word; words start at the first
    // 8-aligned offset after it.
    const WORDS_FROM: usize = (ETH_LEN + IPV4_LEN + UDP_LEN + 8).next_multiple_of(8);
    while off < WORDS_FROM && off < icrc_off {
        let b = if masked(off) { 0xff } else { buf[off] };
        crc = crc32_step1(crc, b);
        off += 1;
    }
    while off + 8 <= icrc_off && off + 8 <= MAX_FRAME {
        let (lo, hi) = word_at(buf, off);
        crc = crc32_step8(crc, lo, hi);
        off += 8;
    }
    while off < icrc_off && off < MAX_FRAME {
        crc = crc32_step1(crc, buf[off]);
        off += 1;
    }
    let mut icrc = (!crc).to_le_bytes();
    // SAFETY: icrc is 4 bytes; the helper checks the packet offset.
    unsafe { bpf_xdp_store_bytes(ctx.ctx, icrc_off as u32, icrc.as_mut_ptr().cast(), 4) == 0 }
}

/// The eight bytes of `buf` at `off` as the little-endian halves `crc32_step8` takes, in one
/// load: a byte at a time doubled the fan-out's CRC loop. `off` is a multiple of 8 below
/// `MAX_FRAME - 7`, and `buf` is a [`Scratch`](crate::maps::Scratch) buffer (8-aligned).
#[inline(always)]
fn word_at(buf: &[u8; MAX_FRAME], off: usize) -> (u32, u32) {
    // SAFETY: in bounds (above); aligned: the scratch buffer is, and `off` is a multiple of 8.
    let w = u64::from_le(unsafe { core::ptr::read(buf.as_ptr().add(off).cast::<u64>()) });
    (w as u32, (w >> 32) as u32)
}

/// The CRC state, run from zero, of the first `n` bytes of `buf`: the part of a result's
/// ICRC that every copy shares (its payload), combined with each copy's own headers by
/// [`copy_icrc`]. The loop counts words in a variable of its own (see `agg::copy_payload`).
#[inline(always)]
pub fn tail_state(buf: &[u8; MAX_FRAME], n: usize) -> u32 {
    // SAFETY: reads a local.
    let words = unsafe { core::ptr::read_volatile(&raw const n) } / 8;
    let mut crc = 0u32;
    let mut i = 0;
    while i < words && i < MAX_FRAME / 8 {
        let (lo, hi) = word_at(buf, i * 8);
        crc = crc32_step8(crc, lo, hi);
        i += 1;
    }
    // A fresh load again: an offset computed from `words` would carry the count each loop
    // exit narrowed, one state per exit for the verifier to walk the rest with.
    // SAFETY: reads a local.
    let n = unsafe { core::ptr::read_volatile(&raw const n) };
    let mut off = n & !7;
    let mut j = 0;
    while j < 7 && off < n && off < MAX_FRAME {
        crc = crc32_step1(crc, buf[off]);
        off += 1;
        j += 1;
    }
    crc
}

/// The ICRC of a result copy: its headers `f` (Ethernet to the INC header, variant fields
/// read as ones), then a payload of `n` bytes whose [`tail_state`] is `tail` (`shift` is
/// `crc32_shift_bytes(n)`).
#[inline(always)]
pub fn copy_icrc(f: &[u8; TEMPLATE_LEN], shift: u32, tail: u32) -> u32 {
    !crc32_combine(header_state(f), shift, tail)
}

/// The ICRC's CRC state after the headers `f` (Ethernet to the INC header; the variant
/// fields read as ones), from the seed.
#[inline(always)]
pub fn header_state(f: &[u8; TEMPLATE_LEN]) -> u32 {
    let mut crc = ICRC_SEED;
    let mut off = ETH_LEN;
    while off < TEMPLATE_LEN {
        crc = crc32_step1(crc, if masked(off) { 0xff } else { f[off] });
        off += 1;
    }
    crc
}
