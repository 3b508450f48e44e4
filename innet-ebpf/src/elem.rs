//! Element types and reduction operations, generic so that each op × type becomes its own
//! small program (the verifier then walks one loop per program, not 96 in one).

use innet_common::{proto::Op, softfloat};

/// Whether the op code `op` (a program's `OP`) is MINLOC or MAXLOC, whose elements carry a
/// location word ([`Op::carries_location`], as a constant the compiler folds).
pub const fn carries_location(op: u8) -> bool {
    match Op::from_u8(op) {
        Some(op) => op.carries_location(),
        None => false,
    }
}

/// An integer element as it sits on the wire (big-endian, `WIDTH` bytes).
pub trait Elem: Copy + PartialOrd + PartialEq {
    const WIDTH: usize;
    const ZERO: Self;
    const ONE: Self;
    /// Reads a big-endian value at `p` (caller checked bounds).
    unsafe fn load(p: *const u8) -> Self;
    /// Writes a big-endian value at `p` (caller checked bounds).
    unsafe fn store(self, p: *mut u8);
    /// [`Elem::load`] from an address aligned to `WIDTH`: one load and one byte swap,
    /// where the unaligned form costs a load, shift and or per byte.
    unsafe fn load_aligned(p: *const u8) -> Self;
    /// [`Elem::store`] to an address aligned to `WIDTH`.
    unsafe fn store_aligned(self, p: *mut u8);
    fn wrapping_add(self, o: Self) -> Self;
    fn wrapping_mul(self, o: Self) -> Self;
    fn and(self, o: Self) -> Self;
    fn or(self, o: Self) -> Self;
    fn xor(self, o: Self) -> Self;
}

macro_rules! elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const WIDTH: usize = core::mem::size_of::<$t>();
            const ZERO: Self = 0;
            const ONE: Self = 1;
            #[inline(always)]
            unsafe fn load(p: *const u8) -> Self {
                <$t>::from_be_bytes(unsafe { *(p as *const [u8; core::mem::size_of::<$t>()]) })
            }
            #[inline(always)]
            unsafe fn store(self, p: *mut u8) {
                unsafe { *(p as *mut [u8; core::mem::size_of::<$t>()]) = self.to_be_bytes() };
            }
            #[inline(always)]
            unsafe fn load_aligned(p: *const u8) -> Self {
                <$t>::from_be(unsafe { *p.cast::<$t>() })
            }
            #[inline(always)]
            unsafe fn store_aligned(self, p: *mut u8) {
                unsafe { *p.cast::<$t>() = self.to_be() };
            }
            #[inline(always)]
            fn wrapping_add(self, o: Self) -> Self { <$t>::wrapping_add(self, o) }
            #[inline(always)]
            fn wrapping_mul(self, o: Self) -> Self { <$t>::wrapping_mul(self, o) }
            #[inline(always)]
            fn and(self, o: Self) -> Self { self & o }
            #[inline(always)]
            fn or(self, o: Self) -> Self { self | o }
            #[inline(always)]
            fn xor(self, o: Self) -> Self { self ^ o }
        }
    )*};
}
elem!(i8, i16, i32, i64, u8, u16, u32, u64);

#[inline(always)]
fn logical<T: Elem>(b: bool) -> T {
    if b { T::ONE } else { T::ZERO }
}

/// `a OP b` for the value-only ops (everything but MINLOC/MAXLOC).
#[inline(always)]
pub fn combine<T: Elem, const OP: u8>(a: T, b: T) -> T {
    match OP {
        x if x == Op::Sum as u8 => a.wrapping_add(b),
        x if x == Op::Prod as u8 => a.wrapping_mul(b),
        x if x == Op::Min as u8 => {
            if b < a {
                b
            } else {
                a
            }
        }
        x if x == Op::Max as u8 => {
            if b > a {
                b
            } else {
                a
            }
        }
        x if x == Op::Band as u8 => a.and(b),
        x if x == Op::Bor as u8 => a.or(b),
        x if x == Op::Bxor as u8 => a.xor(b),
        x if x == Op::Land as u8 => logical(a != T::ZERO && b != T::ZERO),
        x if x == Op::Lor as u8 => logical(a != T::ZERO || b != T::ZERO),
        _ => logical((a != T::ZERO) != (b != T::ZERO)),
    }
}

/// MINLOC/MAXLOC on (value, location) pairs, MPI semantics: the smaller (larger) value
/// wins; on a tie, the smaller location.
#[inline(always)]
pub fn combine_loc<T: Elem, const OP: u8>(a: T, la: i32, b: T, lb: i32) -> (T, i32) {
    let b_wins = if OP == Op::Minloc as u8 { b < a } else { b > a };
    if b_wins || (b == a && lb < la) {
        (b, lb)
    } else {
        (a, la)
    }
}

/// A float element: its IEEE-754 bits in a `u64` (narrower formats in the low bits),
/// big-endian on the wire, with arithmetic from `innet_common::softfloat` (BPF has no float
/// instructions).
pub trait FloatElem {
    const WIDTH: usize;
    type Format: softfloat::Format;
    /// Reads the big-endian value at `p`, aligned to `WIDTH` (caller checked bounds).
    unsafe fn load_aligned(p: *const u8) -> u64;
    /// Reads the big-endian value at any address `p` (caller checked bounds).
    unsafe fn load(p: *const u8) -> u64;
    /// Writes `v` big-endian at `p`, aligned to `WIDTH`.
    unsafe fn store_aligned(v: u64, p: *mut u8);
    /// Writes `v` big-endian at any address `p`.
    unsafe fn store(v: u64, p: *mut u8);
}

macro_rules! float_elem {
    ($($f:ty => $bits:ty),*) => {$(
        impl FloatElem for $f {
            const WIDTH: usize = core::mem::size_of::<$bits>();
            type Format = $f;
            #[inline(always)]
            unsafe fn load_aligned(p: *const u8) -> u64 {
                u64::from(<$bits>::from_be(unsafe { *p.cast::<$bits>() }))
            }
            #[inline(always)]
            unsafe fn load(p: *const u8) -> u64 {
                u64::from(<$bits>::from_be_bytes(unsafe { *(p as *const [u8; core::mem::size_of::<$bits>()]) }))
            }
            #[inline(always)]
            unsafe fn store_aligned(v: u64, p: *mut u8) {
                unsafe { *p.cast::<$bits>() = (v as $bits).to_be() };
            }
            #[inline(always)]
            unsafe fn store(v: u64, p: *mut u8) {
                unsafe { *(p as *mut [u8; core::mem::size_of::<$bits>()]) = (v as $bits).to_be_bytes() };
            }
        }
    )*};
}
float_elem!(
    softfloat::F16 => u16,
    softfloat::BF16 => u16,
    softfloat::F32 => u32,
    softfloat::F64 => u64
);

/// `a OP b` on float bits: SUM and PROD rounded to nearest even, MIN and MAX the IEEE
/// 754-2019 `minimum`/`maximum` (the only float ops MPI defines besides the LOC pairs).
#[inline(always)]
pub fn combine_float<F: FloatElem, const OP: u8>(a: u64, b: u64) -> u64 {
    match OP {
        x if x == Op::Sum as u8 => softfloat::add::<F::Format>(a, b),
        x if x == Op::Prod as u8 => softfloat::mul::<F::Format>(a, b),
        x if x == Op::Min as u8 => softfloat::minimum::<F::Format>(a, b),
        _ => softfloat::maximum::<F::Format>(a, b),
    }
}
