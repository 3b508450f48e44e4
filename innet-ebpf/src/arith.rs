//! How a fold program combines one element of a contribution into its accumulator, per
//! op and type: exact integers, and floats folded in input order (rounding makes order
//! matter). Each fold program (`fold_<op>_<type>`) is `agg::fold_round` over one of these.

use innet_common::{proto::LOC_BYTES, softfloat};

use crate::elem::{Elem, FloatElem, combine, combine_float, combine_loc};

/// How a fold program combines one element of a contribution into its accumulator,
/// both in wire format (big-endian).
pub trait Arith {
    /// The op (`Op as u8`).
    const OP: u8;
    /// Bytes of one value; a MINLOC/MAXLOC element adds [`LOC_BYTES`] of location after it.
    const WIDTH: usize;
    /// Value-only elements one fold step takes (LOC pairs go one a step).
    const PER_STEP: u32;
    /// `acc = acc OP input` for one value-only element.
    ///
    /// # Safety
    /// Both point at `WIDTH` readable (and `acc` writable) bytes, aligned to `WIDTH`.
    unsafe fn combine_at(acc: *mut u8, input: *const u8);
    /// `acc = acc OP input` for one (value, location) pair.
    ///
    /// # Safety
    /// Both point at `WIDTH + LOC_BYTES` readable (and `acc` writable) bytes.
    unsafe fn combine_loc_at(acc: *mut u8, input: *const u8);
}

/// An integer op: exact, so the fold order does not change the result.
pub struct Int<T, const OP: u8>(core::marker::PhantomData<T>);

impl<T: Elem, const OP: u8> Arith for Int<T, OP> {
    const OP: u8 = OP;
    const WIDTH: usize = T::WIDTH;
    const PER_STEP: u32 = 8;
    #[inline(always)]
    unsafe fn combine_at(acc: *mut u8, input: *const u8) {
        // SAFETY: the caller's promise.
        unsafe {
            combine::<T, OP>(T::load_aligned(acc), T::load_aligned(input)).store_aligned(acc);
        }
    }
    #[inline(always)]
    unsafe fn combine_loc_at(acc: *mut u8, input: *const u8) {
        // SAFETY: the caller's promise.
        unsafe {
            let (a, b) = (T::load(acc), T::load(input));
            let (la, lb) = (load_loc(acc.add(T::WIDTH)), load_loc(input.add(T::WIDTH)));
            let (v, l) = combine_loc::<T, OP>(a, la, b, lb);
            v.store(acc);
            store_loc(acc.add(T::WIDTH), l);
        }
    }
}

/// A float op: rounding makes order matter, so contributions are folded in input order.
pub struct Float<F, const OP: u8>(core::marker::PhantomData<F>);

impl<F: FloatElem, const OP: u8> Arith for Float<F, OP> {
    const OP: u8 = OP;
    const WIDTH: usize = F::WIDTH;
    const PER_STEP: u32 = 4;
    #[inline(always)]
    unsafe fn combine_at(acc: *mut u8, input: *const u8) {
        // SAFETY: the caller's promise.
        unsafe {
            let v = combine_float::<F, OP>(F::load_aligned(acc), F::load_aligned(input));
            F::store_aligned(v, acc);
        }
    }
    #[inline(always)]
    unsafe fn combine_loc_at(acc: *mut u8, input: *const u8) {
        // SAFETY: the caller's promise.
        unsafe {
            let a = (F::load(acc), load_loc(acc.add(F::WIDTH)));
            let b = (F::load(input), load_loc(input.add(F::WIDTH)));
            let v = softfloat::select_loc::<F::Format>(
                OP == innet_common::proto::Op::Minloc as u8,
                a,
                b,
            );
            F::store(v.0, acc);
            store_loc(acc.add(F::WIDTH), v.1);
        }
    }
}

#[inline(always)]
unsafe fn load_loc(p: *const u8) -> i32 {
    // SAFETY: the caller's promise (4 readable bytes).
    i32::from_be_bytes(unsafe { *(p as *const [u8; LOC_BYTES]) })
}

#[inline(always)]
unsafe fn store_loc(p: *mut u8, loc: i32) {
    // SAFETY: the caller's promise (4 writable bytes).
    unsafe { *(p as *mut [u8; LOC_BYTES]) = loc.to_be_bytes() };
}
