//! Float rounds: each contribution is stashed whole, and once all are in, one CPU folds them
//! element by element in a fixed input order: a NIC's own host first, then the children by
//! index (the order of their ranks, as the control plane installs them). Float
//! addition and multiplication round, so `(a + b) + c` and `(a + c) + b` may differ in the
//! last bit: folding in a fixed order makes a round's result independent of the order its
//! packets arrived in, retransmissions and losses included.
//!
//! The fold runs under `bpf_loop`, one callback per [`elements_per_step`] elements of each
//! input after the first, so the verifier walks the softfloat code a few times, not once
//! per input and element of the largest payload; a callback per element spent as much on
//! the call and its map lookups as on the addition.

use core::ffi::c_void;

use aya_ebpf::helpers::bpf_loop;
use innet_common::{
    group::{LOCAL_CHILD, MAX_INPUTS, stash_index},
    proto::{LOC_BYTES, MAX_PAYLOAD_BYTES, Op},
    softfloat,
};

use crate::{
    agg::copy_words,
    elem::{FloatElem, carries_location, combine_float},
    maps::{FOLD, SCRATCH, STASH},
};

/// Elements one callback folds: four, or one for the LOC pairs, whose 12-byte elements
/// do not tile the largest payload in fours (the verifier must see every block inside it).
const fn elements_per_step(op: u8) -> u32 {
    if carries_location(op) { 1 } else { 4 }
}

/// What the fold callback needs, in a per-CPU map rather than on the stack: the verifier
/// would track constants on the stack through every step and never see two steps alike.
#[repr(C)]
pub struct Fold {
    /// The slot whose stash is folded.
    slot: u32,
    /// Elements per input.
    count: u32,
    /// Callbacks per input (`count / elements_per_step`, rounded up).
    blocks: u32,
    /// The inputs present after the first, in fold order.
    rest: [u32; MAX_INPUTS as usize],
    /// The step's block of elements and position in `rest`, advanced by each step
    /// (computing them from the step number takes a division whose result the verifier
    /// cannot bound).
    block: u32,
    position: u32,
}

/// Folds the stashed inputs `bitmap` of slot `slot`, `count` elements each, into this CPU's
/// scratch buffer (wire format). False when an element could not be folded.
///
/// The first input present is copied whole; each later one is folded in, input by input:
/// every element still sees its inputs in fold order, and the steps visit only the inputs
/// present (a round of 3 children takes 2 × count steps, not 17 × count).
#[inline(always)]
pub fn fold<F: FloatElem, const OP: u8>(slot: u32, bitmap: u32, count: u32) -> bool {
    let Some(state) = FOLD.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: this CPU's fold state.
    let c = unsafe { &mut *state };
    let blocks = count.div_ceil(elements_per_step(OP));
    (c.slot, c.count, c.blocks, c.block, c.position) = (slot, count, blocks, 0, 0);
    let mut present = 0u32;
    // A sentinel, not an Option: LLVM spills an Option's undefined payload, and the
    // verifier rejects reading an uninitialised register.
    let mut first = MAX_INPUTS;
    // Fold order: the host's own input (LOCAL_CHILD), then children 0, 1, …
    for step in 0..MAX_INPUTS {
        let k = if step == 0 { LOCAL_CHILD } else { step - 1 };
        if bitmap & (1 << k) == 0 {
            continue;
        }
        if first == MAX_INPUTS {
            first = k;
        } else if let Some(r) = c.rest.get_mut(present as usize) {
            *r = k;
            present += 1;
        }
    }
    if first == MAX_INPUTS {
        return false;
    }
    let (Some(entry), Some(out)) = (
        STASH.get_ptr(stash_index(slot, first)),
        SCRATCH.get_ptr_mut(0),
    ) else {
        return false;
    };
    // SAFETY: both are 8-aligned map values of at least MAX_PAYLOAD_BYTES.
    unsafe {
        copy_words(
            (*entry).bytes.as_ptr(),
            (*out).bytes.as_mut_ptr(),
            MAX_PAYLOAD_BYTES,
        );
    };
    let steps = blocks * present;
    if steps == 0 {
        return true;
    }
    let callback = fold_step::<F, OP> as extern "C" fn(u64, *mut c_void) -> i64;
    // SAFETY: the callback takes its state from FOLD, not from the context pointer.
    let done = unsafe { bpf_loop(steps, callback as *mut c_void, core::ptr::null_mut(), 0) };
    done == i64::from(steps)
}

/// One step: elements `block · elements_per_step ..` of input `rest[position]` go into
/// their accumulators in the scratch buffer (`acc = acc OP in_k`). Returns 0 to go on, 1 to
/// stop (an element outside the payload: the fold then fails).
extern "C" fn fold_step<F: FloatElem, const OP: u8>(_: u64, _: *mut c_void) -> i64 {
    let loc = carries_location(OP);
    let size = if loc { F::WIDTH + LOC_BYTES } else { F::WIDTH };
    let per_step = elements_per_step(OP) as usize;
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
    // The whole block lies inside the payload (non-LOC widths tile it in fours).
    let first = block as usize * per_step;
    if first + per_step > MAX_PAYLOAD_BYTES / size {
        return 1;
    }
    let (Some(entry), Some(out)) = (STASH.get_ptr(stash_index(slot, k)), SCRATCH.get_ptr_mut(0))
    else {
        return 1;
    };
    // SAFETY: first·size + per_step·size <= MAX_PAYLOAD_BYTES, the size of a stash entry
    // and less than the scratch buffer's; both 8-aligned map values, every offset a
    // multiple of WIDTH without locations. Addresses are the block's start plus constant
    // steps, so the verifier bounds each access by the check above.
    unsafe {
        let p_block = (*entry).bytes.as_ptr().add(first * size);
        let q_block = (*out).bytes.as_mut_ptr().add(first * size);
        for j in 0..per_step {
            if (first + j) as u32 >= count {
                break;
            }
            let (p, q) = (p_block.add(j * size), q_block.add(j * size));
            if loc {
                let acc = (F::load(q), load_loc(q.add(F::WIDTH)));
                let v = (F::load(p), load_loc(p.add(F::WIDTH)));
                let v = softfloat::select_loc::<F::Format>(OP == Op::Minloc as u8, acc, v);
                F::store(v.0, q);
                *(q.add(F::WIDTH) as *mut [u8; 4]) = v.1.to_be_bytes();
            } else {
                let v = combine_float::<F, OP>(F::load_aligned(q), F::load_aligned(p));
                F::store_aligned(v, q);
            }
        }
    }
    0
}

#[inline(always)]
unsafe fn load_loc(p: *const u8) -> i32 {
    i32::from_be_bytes(unsafe { *(p as *const [u8; 4]) })
}
