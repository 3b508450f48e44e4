//! The element types the typed collectives take, and how each reaches the byte API.
//!
//! Plain numbers are viewed as bytes where they lie (no copy: they have no padding and
//! every byte pattern is a value); MINLOC/MAXLOC pairs are packed value-then-location on
//! the wire, which a Rust struct's padding would not match, so [`Loc`] is copied through
//! a packed buffer.

use innet_common::proto::Dtype;

/// A type the collectives reduce: `i8` … `u64`, `f32`, `f64` and their [`Loc`] pairs
/// (for [`Op::Minloc`](crate::Op::Minloc) / [`Op::Maxloc`](crate::Op::Maxloc)), and the
/// half types [`half::f16`] and [`half::bf16`] (SUM, PROD, MIN, MAX: MPI has no half pairs).
///
/// Sealed: the wire knows these types only.
pub trait Element: Copy + sealed::Sealed {
    /// The type of the value on the wire.
    const DTYPE: Dtype;
}

/// A MINLOC/MAXLOC element: a value and where it came from (MPI's `MPI_2INT`,
/// `MPI_DOUBLE_INT` …). The result holds the smallest (largest) value and, among equal
/// values, the smallest location.
#[derive(Clone, Copy, Debug, Default, PartialEq, PartialOrd)]
pub struct Loc<T> {
    pub value: T,
    pub loc: i32,
}

impl<T> Loc<T> {
    #[must_use]
    pub const fn new(value: T, loc: i32) -> Self {
        Self { value, loc }
    }
}

pub(crate) mod sealed {
    /// How an element reaches the byte API: hidden, so only this crate implements it.
    pub trait Sealed: Sized {
        /// Whether the element is a MINLOC/MAXLOC pair.
        const LOC: bool;
        /// Calls `f` with `send` and `recv` (of any lengths) as native-order bytes, and
        /// leaves in `recv` what `f` left in its bytes.
        fn as_bytes<R>(
            send: &[Self],
            recv: &mut [Self],
            f: impl FnOnce(&[u8], &mut [u8]) -> R,
        ) -> R;
    }
}

/// A plain number, viewed as its bytes where it lies.
macro_rules! value {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl Element for $t {
            const DTYPE: Dtype = Dtype::$d;
        }

        impl sealed::Sealed for $t {
            const LOC: bool = false;
            fn as_bytes<R>(
                send: &[Self],
                recv: &mut [Self],
                f: impl FnOnce(&[u8], &mut [u8]) -> R,
            ) -> R {
                f(bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv))
            }
        }
    )*};
}

/// A half type, viewed as its bits (`u16`s) where it lies.
macro_rules! half {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl Element for $t {
            const DTYPE: Dtype = Dtype::$d;
        }

        impl sealed::Sealed for $t {
            const LOC: bool = false;
            fn as_bytes<R>(
                send: &[Self],
                recv: &mut [Self],
                f: impl FnOnce(&[u8], &mut [u8]) -> R,
            ) -> R {
                use half::slice::HalfFloatSliceExt as _;
                f(
                    bytemuck::cast_slice(send.reinterpret_cast()),
                    bytemuck::cast_slice_mut(recv.reinterpret_cast_mut()),
                )
            }
        }
    )*};
}

/// A plain number and its MINLOC/MAXLOC pair.
macro_rules! plain {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        value!($t => $d);

        impl Element for Loc<$t> {
            const DTYPE: Dtype = Dtype::$d;
        }

        impl sealed::Sealed for Loc<$t> {
            const LOC: bool = true;
            fn as_bytes<R>(
                send: &[Self],
                recv: &mut [Self],
                f: impl FnOnce(&[u8], &mut [u8]) -> R,
            ) -> R {
                const W: usize = size_of::<$t>();
                let packed: Vec<u8> = send
                    .iter()
                    .flat_map(|e| e.value.to_ne_bytes().into_iter().chain(e.loc.to_ne_bytes()))
                    .collect();
                let mut out = vec![0u8; recv.len() * (W + 4)];
                let r = f(&packed, &mut out);
                for (e, b) in recv.iter_mut().zip(out.chunks_exact(W + 4)) {
                    let (v, l) = b.split_at(W);
                    e.value = <$t>::from_ne_bytes(v.try_into().expect("W bytes"));
                    e.loc = i32::from_ne_bytes(l.try_into().expect("4 bytes"));
                }
                r
            }
        }
    )*};
}

plain!(
    i8 => I8, i16 => I16, i32 => I32, i64 => I64,
    u8 => U8, u16 => U16, u32 => U32, u64 => U64,
    f32 => F32, f64 => F64,
);
half!(half::f16 => F16, half::bf16 => BF16);

#[cfg(test)]
mod tests {
    use innet_common::proto::{Op, element_bytes};

    use super::{sealed::Sealed, *};

    #[test]
    #[expect(clippy::float_cmp, reason = "copied values")]
    fn plain_numbers_are_their_native_bytes() {
        let send = [1.5f64, -2.0];
        let mut recv = [0f64; 2];
        let seen = f64::as_bytes(&send, &mut recv, |s, r| {
            r.copy_from_slice(s);
            s.to_vec()
        });
        let want: Vec<u8> = send.iter().flat_map(|v| v.to_ne_bytes()).collect();
        assert_eq!(seen, want);
        assert_eq!(recv, send);
    }

    #[test]
    fn half_types_are_their_native_bytes() {
        let send = [half::f16::from_f32(1.5), half::f16::NEG_INFINITY];
        let mut recv = [half::f16::ZERO; 2];
        let seen = half::f16::as_bytes(&send, &mut recv, |s, r| {
            r.copy_from_slice(s);
            s.to_vec()
        });
        let want: Vec<u8> = send.iter().flat_map(|v| v.to_ne_bytes()).collect();
        assert_eq!(seen, want);
        assert_eq!(recv.map(half::f16::to_bits), send.map(half::f16::to_bits));
        assert_eq!(half::bf16::DTYPE, Dtype::BF16);
        const { assert!(!half::bf16::LOC) };
    }

    #[test]
    fn loc_pairs_are_packed_as_the_wire_wants() {
        let send = [Loc::new(7.25f64, 3), Loc::new(-1.0, 9)];
        let mut recv = [Loc::default(); 2];
        let len = Loc::<f64>::as_bytes(&send, &mut recv, |s, r| {
            r.copy_from_slice(s);
            s.len()
        });
        assert_eq!(len, 2 * element_bytes(Op::Minloc, Dtype::F64));
        assert_eq!(recv, send);
    }
}
