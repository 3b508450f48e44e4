//! Folding a round: each contribution is stashed whole, and once all are in, one CPU folds
//! them element by element in a fixed input order: a NIC's own host first, then the
//! children by index (the order of their ranks, as the control plane installs them). Float
//! addition and multiplication round, so `(a + b) + c` and `(a + c) + b` may differ in the
//! last bit: folding in a fixed order makes a round's result independent of the order its
//! packets arrived in, retransmissions and losses included. Integer ops are exact, and fold
//! the same way for the verifier's sake (see `agg`).
//!
//! The fold runs under `bpf_loop`, one callback per [`elements_per_step`] elements of each
//! input after the first, so the verifier walks the combine code a few times, not once
//! per input and element of the largest payload; a callback per element spent as much on
//! the call and its map lookups as on the addition.

use core::ffi::c_void;

use aya_ebpf::helpers::bpf_loop;
use innet_common::{
    group::{LOCAL_CHILD, MAX_INPUTS, stash_index},
    proto::{LOC_BYTES, MAX_PAYLOAD_BYTES},
};

use crate::{
    arith::Arith,
    elem::carries_location,
    maps::{FOLD, SLOTS, STASH},
};

/// Elements one callback folds: `A::PER_STEP`, or one for the LOC pairs, whose 5- to
/// 12-byte elements do not tile the largest payload in blocks (the verifier must see every
/// block inside it).
const fn elements_per_step<A: Arith>() -> u32 {
    if carries_location(A::OP) {
        1
    } else {
        A::PER_STEP
    }
}

/// Element size of `A` on the wire.
const fn element_size<A: Arith>() -> usize {
    if carries_location(A::OP) {
        A::WIDTH + LOC_BYTES
    } else {
        A::WIDTH
    }
}

// Value-only elements tile the largest payload in steps.
const _: () = assert!((MAX_PAYLOAD_BYTES / 8).is_multiple_of(8));

/// Folds the stashed inputs `bitmap` of slot `slot`, `count` elements (`len` bytes) each,
/// into the slot's data (wire format), which the folding CPU owns while the slot is
/// `SLOT_FOLDING`. False when an element could not be folded.
///
/// The first input present is copied whole; each later one is folded in, input by input:
/// every element still sees its inputs in fold order, and the steps visit only the inputs
/// present (a round of 3 children takes 2 × count steps, not 17 × count).
#[inline(always)]
pub fn fold<A: Arith>(slot: u32, bitmap: u32, count: u32, len: u32) -> bool {
    let Some(state) = FOLD.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: this CPU's fold state.
    let c = unsafe { &mut *state };
    let blocks = count.div_ceil(elements_per_step::<A>());
    (c.slot, c.count, c.blocks, c.block, c.position) = (slot, count, blocks, 0, 0);
    // Fold order: the host's own input (LOCAL_CHILD), then children 0, 1, …
    let input = |step: u32| if step == 0 { LOCAL_CHILD } else { step - 1 };
    // A sentinel, not an Option: LLVM spills an Option's undefined payload, and the
    // verifier rejects reading an uninitialised register.
    (c.first, c.present) = (MAX_INPUTS, 0);
    for step in 0..MAX_INPUTS {
        if bitmap & (1 << input(step)) != 0 {
            c.first = input(step);
            break;
        }
    }
    // SAFETY: this CPU's fold state (a volatile read: LLVM would forward the stores).
    let first = unsafe { core::ptr::read_volatile(&raw const c.first) };
    if first >= MAX_INPUTS {
        return false;
    }
    let rest = bitmap & !(1 << first);
    let (Some(entry), Some(out)) = (
        STASH.get_ptr(stash_index(slot, first)),
        SLOTS.get_ptr_mut(slot),
    ) else {
        return false;
    };
    // SAFETY: both are 8-aligned, MAX_PAYLOAD_BYTES long.
    if !unsafe { copy_blocks((*entry).bytes.as_ptr(), (*out).data.as_mut_ptr(), len) } {
        return false;
    }
    for step in 0..MAX_INPUTS {
        let k = input(step);
        if rest & (1 << k) != 0
            && let Some(r) = c.rest.get_mut(c.present as usize)
        {
            *r = k;
            c.present += 1;
        }
    }
    // SAFETY: as above.
    let present = unsafe { core::ptr::read_volatile(&raw const c.present) };
    let steps = blocks * present;
    if steps == 0 {
        return true;
    }
    let callback = fold_step::<A> as extern "C" fn(u64, *mut c_void) -> i64;
    // SAFETY: the callback takes its state from FOLD, not from the context pointer.
    let done = unsafe { bpf_loop(steps, callback as *mut c_void, core::ptr::null_mut(), 0) };
    done == i64::from(steps)
}

/// One step: elements `block · elements_per_step ..` of input `rest[position]` go into
/// their accumulators in the slot's data (`acc = acc OP in_k`). Returns 0 to go on, 1 to
/// stop (an element outside the payload: the fold then fails).
extern "C" fn fold_step<A: Arith>(_: u64, _: *mut c_void) -> i64 {
    let loc = carries_location(A::OP);
    let size = element_size::<A>();
    let per_step = elements_per_step::<A>() as usize;
    let Some(state) = FOLD.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: this CPU's fold state, written by `fold`.
    let c = unsafe { &mut *state };
    let (slot, block, position, count) = (c.slot, c.block, c.position, c.count);
    if block + 1 == c.blocks {
        (c.block, c.position) = (0, position + 1);
    } else {
        c.block = block + 1;
    }
    let Some(&k) = c.rest.get(position as usize) else {
        return 1;
    };
    // The whole block lies inside the payload (value-only widths tile it in steps).
    let first = block as usize * per_step;
    if first + per_step > MAX_PAYLOAD_BYTES / size {
        return 1;
    }
    let (Some(entry), Some(out)) = (STASH.get_ptr(stash_index(slot, k)), SLOTS.get_ptr_mut(slot))
    else {
        return 1;
    };
    // SAFETY: first·size + per_step·size <= MAX_PAYLOAD_BYTES, the size of a stash entry
    // and of the slot's data; both 8-aligned map values, every offset a
    // multiple of WIDTH without locations. Addresses are the block's start plus constant
    // steps, so the verifier bounds each access by the check above.
    unsafe {
        let p_block = (*entry).bytes.as_ptr().add(first * size);
        let q_block = (*out).data.as_mut_ptr().add(first * size);
        for j in 0..per_step {
            if (first + j) as u32 >= count {
                break;
            }
            let (p, q) = (p_block.add(j * size), q_block.add(j * size));
            if loc {
                A::combine_loc_at(q, p);
            } else {
                A::combine_at(q, p);
            }
        }
    }
    0
}

/// Bytes a [`copy_blocks`] step moves: 32 words, unrolled.
const COPY_BLOCK: usize = 256;
const _: () = assert!(MAX_PAYLOAD_BYTES.is_multiple_of(COPY_BLOCK));

/// A [`copy_blocks`] run: source and destination, 8-aligned map values of at least
/// `MAX_PAYLOAD_BYTES`.
#[repr(C)]
struct Copy {
    src: *const u64,
    dst: *mut u64,
}

/// Copies a `len`-byte payload (rounded up to whole 256 B blocks) between 8-aligned map
/// values of at least `MAX_PAYLOAD_BYTES` bytes (bytes past `len` are never sent as
/// elements), a block per `bpf_loop` callback: walked once by the verifier. False if
/// `bpf_loop` failed.
///
/// # Safety
/// `src` and `dst` are 8-aligned and hold at least `MAX_PAYLOAD_BYTES` bytes.
#[inline(always)]
unsafe fn copy_blocks(src: *const u8, dst: *mut u8, len: u32) -> bool {
    let blocks = (len as usize)
        .div_ceil(COPY_BLOCK)
        .min(MAX_PAYLOAD_BYTES / COPY_BLOCK) as u32;
    let mut copy = Copy {
        src: src.cast(),
        dst: dst.cast(),
    };
    let callback = copy_block as extern "C" fn(u64, *mut c_void) -> i64;
    // SAFETY: the callback's context is `copy`, alive for the call.
    let done = unsafe { bpf_loop(blocks, callback as *mut c_void, (&raw mut copy).cast(), 0) };
    done == i64::from(blocks)
}

/// Block `b` of a [`Copy`].
extern "C" fn copy_block(b: u64, ctx: *mut c_void) -> i64 {
    const WORDS: usize = COPY_BLOCK / 8;
    // SAFETY: `copy_blocks` passes its Copy, alive for the loop.
    let copy = unsafe { &*ctx.cast::<Copy>() };
    let b = b as usize;
    if b >= MAX_PAYLOAD_BYTES / COPY_BLOCK {
        return 1;
    }
    let mut w = 0;
    while w < WORDS {
        // SAFETY: (b + 1) × COPY_BLOCK <= MAX_PAYLOAD_BYTES, inside both buffers
        // (`copy_blocks`' promise), both 8-aligned; volatile keeps LLVM from turning the
        // loop into a memcpy call, which BPF does not have.
        unsafe {
            core::ptr::write_volatile(copy.dst.add(b * WORDS + w), *copy.src.add(b * WORDS + w));
        }
        w += 1;
    }
    0
}
