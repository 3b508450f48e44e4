//! Host-side reduction on wire-format buffers (big-endian elements, MINLOC/MAXLOC pairs):
//! the reference the data plane is tested against, and the local step of the host
//! algorithms. Same semantics as the XDP programs: wrapping SUM/PROD, logical ops yield 0/1,
//! MINLOC/MAXLOC break ties towards the smaller location. Floats use the host's own IEEE
//! arithmetic (`+`, `*`; MIN/MAX as IEEE 754-2019 `minimum`/`maximum` by comparisons), so the
//! data plane's integer-only softfloat is checked against an independent implementation.

use crate::proto::{Dtype, LOC_BYTES, Op, element_bytes};

/// Why two buffers cannot be combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReduceError {
    #[error("buffers differ in length ({0} vs {1} bytes)")]
    Length(usize, usize),
    #[error("{0} bytes is not a whole number of elements")]
    Partial(usize),
    #[error("MPI defines no {} on {} (floats take sum, prod, min, max, minloc and maxloc)", .0.name(), .1.name())]
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
    let is_nan = |v: &[u8]| match w {
        4 => f32::from_be_bytes(v.try_into().expect("4 bytes")).is_nan(),
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
