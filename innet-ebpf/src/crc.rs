//! RoCEv2 ICRC in BPF (no CRC helper exists): table CRC-32 over the frame from the IPv4
//! header to the ICRC, with the variant fields read as ones — byte by byte over the headers
//! that hold them, eight bytes a step (slicing-by-8) over the rest (see
//! `innet_common::icrc` for the definition and its test against an independent CRC).
//!
//! The payload's words run under `bpf_loop`, [`CHUNK`] bytes a callback: the verifier walks
//! a bounded loop once per iteration, and 8 KiB payloads made the CRC loops most of the
//! switch's verification (940 k instructions for the emit program alone, near the kernel's
//! 1 M limit); a callback is walked once.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::{bpf_loop, bpf_xdp_load_bytes, bpf_xdp_store_bytes},
    programs::XdpContext,
};
use innet_common::{
    group::{ICRC_SEED, TEMPLATE_LEN, crc32_mul_step, crc32_step1, crc32_step8},
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
    let Some(crc) = crc_rest(buf, off, icrc_off, crc) else {
        return false;
    };
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
/// [`copy_icrc`]. `None` if `bpf_loop` failed.
#[inline(always)]
pub fn tail_state(buf: &[u8; MAX_FRAME], n: usize) -> Option<u32> {
    crc_rest(buf, 0, n, 0)
}

/// Bytes one `bpf_loop` callback runs the CRC over: eight words, unrolled.
const CHUNK: usize = 64;

/// A CRC run under `bpf_loop`: the buffer, where the chunks start, the state so far.
#[repr(C)]
struct CrcRun {
    buf: *const [u8; MAX_FRAME],
    from: usize,
    crc: u32,
}

/// The CRC state `crc` continued over `buf[from..end]` (`from` a multiple of 8): whole
/// chunks under `bpf_loop`, then up to seven words and seven bytes. `None` if `bpf_loop`
/// failed.
#[inline(always)]
fn crc_rest(buf: &[u8; MAX_FRAME], from: usize, end: usize, crc: u32) -> Option<u32> {
    if from > end || end > MAX_FRAME {
        return None;
    }
    let chunks = ((end - from) / CHUNK) as u32;
    let mut run = CrcRun { buf, from, crc };
    if chunks > 0 {
        let callback = crc_chunk as extern "C" fn(u64, *mut c_void) -> i64;
        // SAFETY: the callback's context is `run`, alive for the call.
        let done = unsafe { bpf_loop(chunks, callback as *mut c_void, (&raw mut run).cast(), 0) };
        if done != i64::from(chunks) {
            return None;
        }
    }
    // Each index is a fresh load, checked right before its access: LLVM would otherwise
    // hoist the address out of the loop and leave the verifier a check on another register.
    let mut crc = run.crc;
    let mut off = from + chunks as usize * CHUNK;
    let mut k = 0;
    while k < CHUNK / 8 - 1 {
        let o = fresh(off);
        if o + 8 > end || o + 8 > MAX_FRAME {
            break;
        }
        let (lo, hi) = word_at(buf, o);
        crc = crc32_step8(crc, lo, hi);
        off = o + 8;
        k += 1;
    }
    k = 0;
    while k < 7 {
        let o = fresh(off);
        if o >= end || o >= MAX_FRAME {
            break;
        }
        crc = crc32_step1(crc, buf[o]);
        off = o + 1;
        k += 1;
    }
    Some(crc)
}

/// `v` as a fresh load, unrelated (for LLVM) to the computation that made it.
#[inline(always)]
fn fresh(v: usize) -> usize {
    // SAFETY: reads a local.
    unsafe { core::ptr::read_volatile(&raw const v) }
}

/// One chunk of a [`CrcRun`]: chunk `i` from its start.
extern "C" fn crc_chunk(i: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `crc_rest` passes its CrcRun.
    let run = unsafe { &mut *ctx.cast::<CrcRun>() };
    // Both terms bounded first: the verifier then knows the sum is not negative.
    let (i, from) = (i as usize, run.from);
    if i >= MAX_FRAME / CHUNK || from >= MAX_FRAME {
        return 1;
    }
    let off = fresh(from + i * CHUNK);
    if off + CHUNK > MAX_FRAME {
        return 1;
    }
    // SAFETY: the buffer `crc_rest` was given, alive for the loop.
    let buf = unsafe { &*run.buf };
    let mut crc = run.crc;
    let mut w = 0;
    while w < CHUNK {
        let (lo, hi) = word_at(buf, off + w);
        crc = crc32_step8(crc, lo, hi);
        w += 8;
    }
    run.crc = crc;
    0
}

/// The ICRC of a result copy: its headers `f` (Ethernet to the INC header, variant fields
/// read as ones), then a payload of `n` bytes whose [`tail_state`] is `tail` (`shift` is
/// `crc32_shift_lookup(n)`): `crc32_combine`, its multiplication run by `bpf_loop`.
#[inline(always)]
pub fn copy_icrc(f: &[u8; TEMPLATE_LEN], shift: u32, tail: u32) -> u32 {
    !(mul_in_steps(shift, header_state(f)) ^ tail)
}

/// `crc32_mul(a, b)`, its steps run by `bpf_loop` (`crc32_mul_step`: inline in the
/// per-child callback of the fan-out, the verifier walked them past 1 M instructions).
#[inline(always)]
fn mul_in_steps(a: u32, b: u32) -> u32 {
    let mut m = MulSteps { a, p: 0, b };
    let callback = mul_step as extern "C" fn(u64, *mut c_void) -> i64;
    // SAFETY: the callback's context is `m`, alive for the call.
    unsafe { bpf_loop(32, callback as *mut c_void, (&raw mut m).cast(), 0) };
    m.p
}

/// [`mul_in_steps`]' state: the factor whose bits pick, the product so far, the other
/// factor times `x^i`.
#[repr(C)]
struct MulSteps {
    a: u32,
    p: u32,
    b: u32,
}

extern "C" fn mul_step(i: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `mul_in_steps` passes its MulSteps, alive for the loop.
    let m = unsafe { &mut *ctx.cast::<MulSteps>() };
    (m.p, m.b) = crc32_mul_step(m.a, i as u32, (m.p, m.b));
    0
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
