//! Host-side reduction on wire-format buffers (big-endian elements, MINLOC/MAXLOC pairs):
//! the reference the data plane is tested against, and the local step of the host
//! algorithms. Same semantics as the XDP programs: wrapping SUM/PROD, logical ops yield 0/1,
//! MINLOC/MAXLOC break ties towards the smaller location. Floats use the host's own IEEE
//! arithmetic (`+`, `*`; MIN/MAX as IEEE 754-2019 `minimum`/`maximum` by comparisons), so the
//! data plane's integer-only softfloat is checked against an independent implementation;
//! float16 and bfloat16 are widened to `f64`, combined there and rounded back (see
//! `round_half`).

use crate::proto::{Dtype, LOC_BYTES, Op, element_bytes};

/// Why two buffers cannot be combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReduceError {
    #[error("buffers differ in length ({0} vs {1} bytes)")]
    Length(usize, usize),
    #[error("{0} bytes is not a whole number of elements")]
    Partial(usize),
    #[error("MPI defines no {} on {} (floats take sum, prod, min, max, and minloc and maxloc but not on half types)", .0.name(), .1.name())]
    Undefined(Op, Dtype),
}

macro_rules! reduce_as {
    ($t:ty, $op:expr, $acc:expr, $other:expr, $size:expr) => {{
        const W: usize = core::mem::size_of::<$t>();
        for (a, b) in $acc.chunks_exact_mut($size).zip($other.chunks_exact($size)) {
            let x = <$t>::from_be_bytes(a[..W].try_into().expect("W bytes"));
            let y = <$t>::from_be_bytes(b[..W].try_into().expect("W bytes"));
            let logical = |v: bool| -> $t { if v { 1 } else { 0 } };
            let v: $t = match $op {
                Op::Sum => x.wrapping_add(y),
                Op::Prod => x.wrapping_mul(y),
                Op::Min => x.min(y),
                Op::Max => x.max(y),
                Op::Band => x & y,
                Op::Bor => x | y,
                Op::Bxor => x ^ y,
                Op::Land => logical(x != 0 && y != 0),
                Op::Lor => logical(x != 0 || y != 0),
                Op::Lxor => logical((x != 0) != (y != 0)),
                Op::Minloc | Op::Maxloc => {
                    let lx = i32::from_be_bytes(a[W..W + LOC_BYTES].try_into().expect("4 bytes"));
                    let ly = i32::from_be_bytes(b[W..W + LOC_BYTES].try_into().expect("4 bytes"));
                    let y_wins = if $op == Op::Minloc { y < x } else { y > x };
                    if y_wins || (y == x && ly < lx) {
                        a[W..W + LOC_BYTES].copy_from_slice(&ly.to_be_bytes());
                        y
                    } else {
                        x
                    }
                }
            };
            a[..W].copy_from_slice(&v.to_be_bytes());
        }
    }};
}

/// IEEE 754-2019 `minimum` (`min`) or `maximum` with the host's comparisons (Rust's
/// `f64::minimum` is unstable): NaN if either is; −0 below +0.
macro_rules! ieee_pick {
    ($min:expr, $x:expr, $y:expr) => {{
        let (x, y) = ($x, $y);
        if x.is_nan() || y.is_nan() {
            x + y
        } else if x.to_bits() == y.to_bits() || (x.abs() == 0.0 && y.abs() == 0.0) {
            // Equal: the same value, or zeros of either sign (−0 below +0).
            if x.is_sign_negative() == $min { x } else { y }
        } else if (x < y) == $min {
            x
        } else {
            y
        }
    }};
}

// Exact float comparisons are the point: IEEE semantics, bit for bit.
macro_rules! reduce_float {
    ($t:ty, $op:expr, $acc:expr, $other:expr, $size:expr) => {{
        const W: usize = core::mem::size_of::<$t>();
        for (a, b) in $acc.chunks_exact_mut($size).zip($other.chunks_exact($size)) {
            let x = <$t>::from_be_bytes(a[..W].try_into().expect("W bytes"));
            let y = <$t>::from_be_bytes(b[..W].try_into().expect("W bytes"));
            let v: $t = match $op {
                Op::Sum => x + y,
                Op::Prod => x * y,
                Op::Min => ieee_pick!(true, x, y),
                Op::Max => ieee_pick!(false, x, y),
                Op::Minloc | Op::Maxloc => {
                    let lx = i32::from_be_bytes(a[W..W + LOC_BYTES].try_into().expect("4 bytes"));
                    let ly = i32::from_be_bytes(b[W..W + LOC_BYTES].try_into().expect("4 bytes"));
                    let min = $op == Op::Minloc;
                    let v = ieee_pick!(min, x, y);
                    // The location of the operand the value came from; the smaller on a tie.
                    let l = if x.is_nan() {
                        lx
                    } else if y.is_nan()
                        || (x.to_bits() != y.to_bits() && v.to_bits() == y.to_bits())
                    {
                        ly
                    } else if x.to_bits() == y.to_bits() {
                        lx.min(ly)
                    } else {
                        lx
                    };
                    a[W..W + LOC_BYTES].copy_from_slice(&l.to_be_bytes());
                    v
                }
                _ => unreachable!("checked by Op::defined_on"),
            };
            a[..W].copy_from_slice(&v.to_be_bytes());
        }
    }};
}

/// A 16-bit float type through `f64`.
trait Half: Copy {
    fn from_bits(b: u16) -> Self;
    fn to_bits(self) -> u16;
    fn from_f32(v: f32) -> Self;
}

macro_rules! half_type {
    ($($t:ty),*) => {$(
        impl Half for $t {
            fn from_bits(b: u16) -> Self { <$t>::from_bits(b) }
            fn to_bits(self) -> u16 { <$t>::to_bits(self) }
            fn from_f32(v: f32) -> Self { <$t>::from_f32(v) }
        }
    )*};
}
half_type!(half::f16, half::bf16);

/// Rounds `v` to the half type, nearest even. The host's `f64` result of an operation on
/// half values is itself rounded, but innocuously: 53 ≥ 2·11 + 2 (Figueroa's bound for a
/// second rounding to agree with a single one, p = 11 for binary16, 8 for bfloat16). `v` goes
/// to `f32` rounded to odd (truncated, lowest bit set if inexact), which keeps the sticky
/// information a second rounding needs (24 ≥ 11 + 2), then `half` rounds the `f32`. Not
/// `half`'s `from_f64`: version 2.7 drops the low 32 bits of an `f64` before it rounds (or
/// goes through a nearest-even `f32` when the CPU has F16C), wrong for some ties.
#[expect(clippy::float_cmp, reason = "exactness is the question")]
fn round_half<H: Half>(v: f64) -> H {
    if v.is_nan() {
        return H::from_f32(v as f32);
    }
    let near = v as f32;
    if f64::from(near) == v {
        return H::from_f32(near);
    }
    // `near` is the neighbour above or below `v`; truncate towards zero, then make odd.
    let bits = if f64::from(near).abs() > v.abs() {
        near.to_bits() - 1
    } else {
        near.to_bits()
    };
    H::from_f32(f32::from_bits(bits | 1))
}

macro_rules! reduce_half {
    ($t:ty, $op:expr, $acc:expr, $other:expr) => {{
        for (a, b) in $acc.chunks_exact_mut(2).zip($other.chunks_exact(2)) {
            let x = <$t as Half>::from_bits(u16::from_be_bytes([a[0], a[1]]));
            let y = <$t as Half>::from_bits(u16::from_be_bytes([b[0], b[1]]));
            let (fx, fy) = (x.to_f64(), y.to_f64());
            let v: $t = match $op {
                Op::Sum => round_half(fx + fy),
                Op::Prod => round_half(fx * fy),
                // Widening is exact, so the pick is made on the f64s and the winner's own
                // bits are kept; a NaN operand makes a NaN (`fx + fy`), like minimum/maximum.
                Op::Min | Op::Max => {
                    let min = $op == Op::Min;
                    let v = ieee_pick!(min, fx, fy);
                    if v.is_nan() {
                        round_half(v)
                    } else if v.to_bits() == fx.to_bits() {
                        x
                    } else {
                        y
                    }
                }
                _ => unreachable!("checked by Op::defined_on"),
            };
            a.copy_from_slice(&Half::to_bits(v).to_be_bytes());
        }
    }};
}

/// `acc = acc OP other`, element by element.
///
/// # Errors
/// Length mismatch, a partial element, or an op MPI does not define on the type.
pub fn combine_into(op: Op, dtype: Dtype, acc: &mut [u8], other: &[u8]) -> Result<(), ReduceError> {
    if acc.len() != other.len() {
        return Err(ReduceError::Length(acc.len(), other.len()));
    }
    if !op.defined_on(dtype) {
        return Err(ReduceError::Undefined(op, dtype));
    }
    let size = element_bytes(op, dtype);
    if !acc.len().is_multiple_of(size) {
        return Err(ReduceError::Partial(acc.len()));
    }
    match dtype {
        Dtype::I8 => reduce_as!(i8, op, acc, other, size),
        Dtype::I16 => reduce_as!(i16, op, acc, other, size),
        Dtype::I32 => reduce_as!(i32, op, acc, other, size),
        Dtype::I64 => reduce_as!(i64, op, acc, other, size),
        Dtype::U8 => reduce_as!(u8, op, acc, other, size),
        Dtype::U16 => reduce_as!(u16, op, acc, other, size),
        Dtype::U32 => reduce_as!(u32, op, acc, other, size),
        Dtype::U64 => reduce_as!(u64, op, acc, other, size),
        Dtype::F32 => reduce_float!(f32, op, acc, other, size),
        Dtype::F64 => reduce_float!(f64, op, acc, other, size),
        Dtype::F16 => reduce_half!(half::f16, op, acc, other),
        Dtype::BF16 => reduce_half!(half::bf16, op, acc, other),
    }
    Ok(())
}

/// Whether two wire-format results are the same, a float NaN matching any NaN: IEEE 754
/// leaves a NaN result's sign and payload open, and hosts differ (x86's invalid-operation
/// NaN is negative, the data plane's and ARM's positive). Everything else bit for bit.
#[must_use]
pub fn same_result(op: Op, dtype: Dtype, a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    if !dtype.is_float() {
        return a == b;
    }
    let (w, size) = (dtype.width(), element_bytes(op, dtype));
    let is_nan = |v: &[u8]| match dtype {
        Dtype::F16 => half::f16::from_be_bytes([v[0], v[1]]).is_nan(),
        Dtype::BF16 => half::bf16::from_be_bytes([v[0], v[1]]).is_nan(),
        Dtype::F32 => f32::from_be_bytes(v.try_into().expect("4 bytes")).is_nan(),
        _ => f64::from_be_bytes(v.try_into().expect("8 bytes")).is_nan(),
    };
    a.chunks_exact(size)
        .zip(b.chunks_exact(size))
        .all(|(x, y)| {
            x[w..] == y[w..] && (x[..w] == y[..w] || (is_nan(&x[..w]) && is_nan(&y[..w])))
        })
}

/// `acc = earlier OP acc`: the combination with the operands in rank order, when the
/// other buffer comes from a lower rank. Integers do not care; floats do in NaN payloads,
/// and pairwise exchanges must give both partners the same bits.
///
/// # Errors
/// As [`combine_into`].
pub fn combine_after(
    op: Op,
    dtype: Dtype,
    acc: &mut [u8],
    earlier: &[u8],
) -> Result<(), ReduceError> {
    if !dtype.is_float() {
        // Every integer op is commutative bit for bit: no copy needed.
        return combine_into(op, dtype, acc, earlier);
    }
    let mut ordered = earlier.to_vec();
    combine_into(op, dtype, &mut ordered, acc)?;
    acc.copy_from_slice(&ordered);
    Ok(())
}

/// Folds `parts` left to right (the first part is taken as is); any byte buffers do
/// (`Vec<u8>`s, slices, references to either).
///
/// # Errors
/// As [`combine_into`]; an empty `parts` gives an empty result.
pub fn reduce_all<P: AsRef<[u8]>>(
    op: Op,
    dtype: Dtype,
    parts: &[P],
) -> Result<std::vec::Vec<u8>, ReduceError> {
    let Some((first, rest)) = parts.split_first() else {
        return Ok(std::vec::Vec::new());
    };
    let mut acc = first.as_ref().to_vec();
    for p in rest {
        combine_into(op, dtype, &mut acc, p.as_ref())?;
    }
    Ok(acc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::encode_elements;
    use std::vec;

    fn enc(d: Dtype, v: &[i64]) -> std::vec::Vec<u8> {
        encode_elements(d, v, None)
    }

    #[test]
    fn integer_ops_wrap_and_compare_by_type() {
        let r = reduce_all(
            Op::Sum,
            Dtype::U8,
            &[&enc(Dtype::U8, &[250]), &enc(Dtype::U8, &[10])],
        )
        .unwrap();
        assert_eq!(r, [4], "u8 wraps");
        let r = reduce_all(
            Op::Min,
            Dtype::I16,
            &[&enc(Dtype::I16, &[-1]), &enc(Dtype::I16, &[5])],
        )
        .unwrap();
        assert_eq!(r, enc(Dtype::I16, &[-1]), "signed compare");
        let r = reduce_all(
            Op::Min,
            Dtype::U16,
            &[&enc(Dtype::U16, &[0xffff]), &enc(Dtype::U16, &[5])],
        )
        .unwrap();
        assert_eq!(r, enc(Dtype::U16, &[5]), "unsigned compare");
        let r = reduce_all(
            Op::Prod,
            Dtype::I32,
            &[&enc(Dtype::I32, &[1 << 20]), &enc(Dtype::I32, &[1 << 12])],
        )
        .unwrap();
        assert_eq!(r, enc(Dtype::I32, &[0]), "i32 product wraps");
        let r = reduce_all(
            Op::Land,
            Dtype::I64,
            &[&enc(Dtype::I64, &[7, 0]), &enc(Dtype::I64, &[-3, 9])],
        )
        .unwrap();
        assert_eq!(r, enc(Dtype::I64, &[1, 0]));
        let r = reduce_all(
            Op::Lxor,
            Dtype::U32,
            &[&enc(Dtype::U32, &[7, 0]), &enc(Dtype::U32, &[3, 9])],
        )
        .unwrap();
        assert_eq!(r, enc(Dtype::U32, &[0, 1]));
    }

    #[test]
    fn minloc_and_maxloc_break_ties_to_the_smaller_location() {
        let a = encode_elements(Dtype::I32, &[5, 5, 1], Some(&[3, 3, 9]));
        let b = encode_elements(Dtype::I32, &[5, 4, 1], Some(&[1, 0, 2]));
        assert_eq!(
            reduce_all(Op::Minloc, Dtype::I32, &[&a, &b]).unwrap(),
            encode_elements(Dtype::I32, &[5, 4, 1], Some(&[1, 0, 2]))
        );
        assert_eq!(
            reduce_all(Op::Maxloc, Dtype::I32, &[&a, &b]).unwrap(),
            encode_elements(Dtype::I32, &[5, 5, 1], Some(&[1, 3, 2]))
        );
    }

    /// A deterministic xorshift generator.
    fn rng(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn half_rounding_is_to_nearest_even() {
        use half::{bf16, f16};
        let f = |v: f64| round_half::<f16>(v).to_bits();
        let b = |v: f64| round_half::<bf16>(v).to_bits();
        let ulp16 = (-10f64).exp2();
        // Ties go to the even neighbour; a hair above a tie goes up.
        assert_eq!(f(1.0 + ulp16 / 2.0), 0x3c00);
        assert_eq!(f(1.0 + 1.5 * ulp16), 0x3c02);
        // Sticky bits below f32's precision count too.
        assert_eq!(f(1.0 + ulp16 / 2.0 + (-40f64).exp2()), 0x3c01);
        assert_eq!(f(1.0 + 1.5 * ulp16 - (-40f64).exp2()), 0x3c01);
        assert_eq!(f(-1.0 - ulp16 / 2.0 - (-40f64).exp2()), 0xbc01);
        // The overflow threshold: 65504 + 16 (half an ulp) is a tie whose even side is ∞.
        assert_eq!(f(65504.0 + 15.999), 0x7bff);
        assert_eq!(f(65520.0), 0x7c00);
        // Subnormals: 2^-25 ties between 0 and 2^-24; 3·2^-25 between 2^-24 and 2^-23.
        assert_eq!(f((-25f64).exp2()), 0);
        assert_eq!(f(3.0 * (-25f64).exp2()), 2);
        assert_eq!(f(-(-25f64).exp2()), 0x8000);
        let ulpb = (-7f64).exp2();
        assert_eq!(b(1.0 + ulpb / 2.0), 0x3f80);
        assert_eq!(b(1.0 + 1.5 * ulpb), 0x3f82);
        assert_eq!(b(1.0 + ulpb / 2.0 + (-50f64).exp2()), 0x3f81);
        assert_eq!(b(f64::MAX), 0x7f80);
        assert_eq!(b(-f64::MAX), 0xff80);
        assert_eq!(
            f(f64::from(f32::MIN_POSITIVE) / 4.0),
            0,
            "far below binary16's range"
        );
        assert_eq!(
            b(f64::from(f32::MAX)),
            0x7f80,
            "f32::MAX rounds up to ∞ in bfloat16"
        );
        assert_eq!(b((-134f64).exp2()), 0, "a tie at the smallest subnormal");
        assert_eq!(b(3.0 * (-134f64).exp2()), 2);
        assert!(round_half::<f16>(f64::NAN).is_nan() && round_half::<bf16>(f64::NAN).is_nan());
    }

    /// Independent paths agree: this reference (host `f64`, rounded back) and the data
    /// plane's integer softfloat, over every first operand and random second ones.
    #[test]
    fn half_reference_matches_softfloat() {
        use crate::softfloat::{self, BF16, F16, Format};
        fn check<F: Format>(dtype: Dtype) {
            let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ dtype as u64;
            let mut seconds: std::vec::Vec<u16> = std::vec![
                0, 0x8000, 1, 0x8001, 0x3c00, 0x3f80, 0x7bff, 0x7c00, 0xfc00, 0x7f80, 0xff80,
                0x7e00, 0x7fc0, 0x7c01,
            ];
            seconds.extend((0..48).map(|_| rng(&mut state) as u16));
            for op in [Op::Sum, Op::Prod, Op::Min, Op::Max] {
                let mut acc = std::vec::Vec::new();
                let mut other = std::vec::Vec::new();
                let mut want = std::vec::Vec::new();
                for a in 0..=u16::MAX {
                    for &b in &seconds {
                        acc.extend_from_slice(&a.to_be_bytes());
                        other.extend_from_slice(&b.to_be_bytes());
                        let (a, b) = (u64::from(a), u64::from(b));
                        let v = match op {
                            Op::Sum => softfloat::add::<F>(a, b),
                            Op::Prod => softfloat::mul::<F>(a, b),
                            Op::Min => softfloat::minimum::<F>(a, b),
                            _ => softfloat::maximum::<F>(a, b),
                        };
                        want.extend_from_slice(&(v as u16).to_be_bytes());
                    }
                }
                combine_into(op, dtype, &mut acc, &other).unwrap();
                // Bit for bit, but for NaNs (any NaN matches).
                assert!(
                    same_result(op, dtype, &acc, &want),
                    "{} {}: the reference and softfloat differ",
                    op.name(),
                    dtype.name()
                );
            }
        }
        check::<F16>(Dtype::F16);
        check::<BF16>(Dtype::BF16);
    }

    #[test]
    fn half_types_take_no_loc_pairs() {
        let mut a = vec![0u8; 6];
        for d in [Dtype::F16, Dtype::BF16] {
            assert_eq!(
                combine_into(Op::Minloc, d, &mut a, &[0; 6]),
                Err(ReduceError::Undefined(Op::Minloc, d))
            );
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let mut a = vec![0u8; 4];
        assert_eq!(
            combine_into(Op::Sum, Dtype::I32, &mut a, &[0; 8]),
            Err(ReduceError::Length(4, 8))
        );
        assert_eq!(
            combine_into(Op::Sum, Dtype::I64, &mut a, &[0; 4]),
            Err(ReduceError::Partial(4))
        );
        assert_eq!(
            combine_into(Op::Bxor, Dtype::F32, &mut a, &[0; 4]),
            Err(ReduceError::Undefined(Op::Bxor, Dtype::F32))
        );
    }
}
