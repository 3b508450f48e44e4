//! Float rounds: each contribution is stashed whole, and once all are in, one CPU folds them
//! element by element in a fixed input order: a NIC's own host first, then the children by
//! index (the order of their ranks, as the control plane installs them). Float
//! addition and multiplication round, so `(a + b) + c` and `(a + c) + b` may differ in the
//! last bit: folding in a fixed order makes a round's result independent of the order its
//! packets arrived in, retransmissions and losses included.
//!
//! The fold runs under `bpf_loop`, one callback per element × input, so the verifier walks
//! the softfloat code once, not once per input and element of the largest payload.

use core::ffi::c_void;

use aya_ebpf::helpers::bpf_loop;
use innet_common::{
    group::{LOCAL_CHILD, MAX_INPUTS, stash_index},
    proto::{LOC_BYTES, MAX_PAYLOAD_BYTES, Op},
    softfloat,
};

use crate::{
    elem::{FloatElem, combine_float},
    maps::{FOLD, SCRATCH, STASH},
};

/// What the fold callback needs, in a per-CPU map rather than on the stack: the verifier
/// would track constants on the stack through every step and never see two steps alike.
#[repr(C)]
pub struct Fold {
    /// The slot whose stash is folded.
    slot: u32,
    /// Bit `i`: input `i` is in the stash.
    bitmap: u32,
    /// The first input present in fold order: its values start each element's fold.
    first: u32,
    /// The step's element and input, advanced by each step (computing them from the step
    /// number takes a division whose result the verifier cannot bound).
    element: u32,
    input: u32,
}

/// Folds the stashed inputs `bitmap` of slot `slot`, `count` elements each, into this CPU's
/// scratch buffer (wire format). False when an element could not be folded.
#[inline(always)]
pub fn fold<F: FloatElem, const OP: u8>(slot: u32, bitmap: u32, count: u32) -> bool {
    if bitmap == 0 {
        return false;
    }
    let Some(state) = FOLD.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: this CPU's fold state.
    unsafe {
        *state = Fold {
            slot,
            bitmap,
            first: if bitmap & 1 << LOCAL_CHILD != 0 {
                LOCAL_CHILD
            } else {
                bitmap.trailing_zeros()
            },
            element: 0,
            input: 0,
        };
    }
    let steps = count * MAX_INPUTS;
    let callback = fold_step::<F, OP> as extern "C" fn(u64, *mut c_void) -> i64;
    // SAFETY: the callback takes its state from FOLD, not from the context pointer.
    let done = unsafe { bpf_loop(steps, callback as *mut c_void, core::ptr::null_mut(), 0) };
    done == i64::from(steps)
}

/// One step: input `input` of element `element` goes into the element's
/// accumulator in the scratch buffer (`acc = acc OP in_k`; the first input present is
/// copied). Inputs of an element come in ascending order. Returns 0 to go on, 1 to stop (an
/// element outside the payload: the fold then fails).
extern "C" fn fold_step<F: FloatElem, const OP: u8>(_: u64, _: *mut c_void) -> i64 {
    let loc = OP == Op::Minloc as u8 || OP == Op::Maxloc as u8;
    let size = if loc { F::WIDTH + LOC_BYTES } else { F::WIDTH };
    let Some(state) = FOLD.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: this CPU's fold state, written by `fold`.
    let c = unsafe { &mut *state };
    let (slot, bitmap, first, i, step) = (c.slot, c.bitmap, c.first, c.element, c.input);
    if step + 1 == MAX_INPUTS {
        (c.element, c.input) = (i + 1, 0);
    } else {
        c.input = step + 1;
    }
    if i as usize >= MAX_PAYLOAD_BYTES / size || step >= MAX_INPUTS {
        return 1;
    }
    // Fold order: the host's own input (LOCAL_CHILD), then children 0, 1, …
    let k = if step == 0 { LOCAL_CHILD } else { step - 1 };
    let off = i as usize * size;
    if bitmap & (1 << k) == 0 {
        return 0;
    }
    let (Some(entry), Some(out)) = (STASH.get_ptr(stash_index(slot, k)), SCRATCH.get_ptr_mut(0))
    else {
        return 1;
    };
    // SAFETY: off + size <= MAX_PAYLOAD_BYTES, the size of a stash entry and less than the
    // scratch buffer's; both 8-aligned map values, off a multiple of WIDTH without locations.
    unsafe {
        let p = (*entry).bytes.as_ptr().add(off);
        let q = (*out).bytes.as_mut_ptr().add(off);
        if loc {
            let mut v = (F::load(p), load_loc(p.add(F::WIDTH)));
            if k != first {
                let acc = (F::load(q), load_loc(q.add(F::WIDTH)));
                v = softfloat::select_loc::<F::Format>(OP == Op::Minloc as u8, acc, v);
            }
            F::store(v.0, q);
            *(q.add(F::WIDTH) as *mut [u8; 4]) = v.1.to_be_bytes();
        } else {
            let mut v = F::load_aligned(p);
            if k != first {
                v = combine_float::<F, OP>(F::load_aligned(q), v);
            }
            F::store_aligned(v, q);
        }
    }
    0
}

#[inline(always)]
unsafe fn load_loc(p: *const u8) -> i32 {
    i32::from_be_bytes(unsafe { *(p as *const [u8; 4]) })
}
