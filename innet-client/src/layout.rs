//! How a caller's elements lie in memory, beside [`Element`](crate::Element): a strided
//! array (MPI's buffers: elements `stride` bytes apart, a MINLOC/MAXLOC pair's location
//! after padding), and the packed message innet sends, in native or wire order.
//!
//! Gathering into the wire's order and scattering out of it take one pass over the
//! message: each chunk is converted while it is still in cache.

use innet_common::proto::{Dtype, LOC_BYTES, Op, element_bytes};

use crate::frames::swap_order;

/// Elements per chunk of a gather or scatter: a multiple of 8, so that every chunk holds
/// whole words of the widest type a message travels as.
const CHUNK: usize = 1024;

/// The byte order of a packed message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// The caller's.
    Native,
    /// The wire's (big-endian), in the type the message travels as ([`wire_dtype`]).
    Wire,
}

/// The type a message of `bytes` travels as. Bitwise ops act on bytes whatever the type:
/// the widest word that tiles the message gives the same bytes with fewer elements to
/// combine (a broadcast's or an allgather's bytes as u64).
#[must_use]
pub fn wire_dtype(op: Op, dtype: Dtype, bytes: usize) -> Dtype {
    if matches!(op, Op::Band | Op::Bor | Op::Bxor) {
        Dtype::bitwise_word(bytes)
    } else {
        dtype
    }
}

/// `count` elements `stride` bytes apart; a MINLOC/MAXLOC pair's location `loc_offset`
/// bytes into its element (C's `struct { double v; int loc; }` is 16 bytes with the
/// location at 8; innet packs value and location, 12 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strided {
    pub count: usize,
    pub stride: usize,
    pub loc_offset: usize,
}

impl Strided {
    /// Whether the elements lie as innet sends them (no padding anywhere).
    #[must_use]
    pub fn is_packed(&self, op: Op, dtype: Dtype) -> bool {
        let elem = element_bytes(op, dtype);
        self.stride == elem && (!op.carries_location() || self.loc_offset == dtype.width())
    }

    /// Bytes of the packed message.
    #[must_use]
    pub fn packed_bytes(&self, op: Op, dtype: Dtype) -> usize {
        self.count * element_bytes(op, dtype)
    }

    /// The bytes of one element the layout uses: a pair's location may sit past its
    /// value's width, and padding after it is not touched (the last element of an array
    /// need not have its trailing padding).
    #[must_use]
    pub fn used_bytes(&self, op: Op, dtype: Dtype) -> usize {
        if op.carries_location() {
            self.loc_offset + LOC_BYTES
        } else {
            dtype.width()
        }
    }

    /// Bytes a buffer of this layout spans.
    #[must_use]
    pub fn span(&self, op: Op, dtype: Dtype) -> usize {
        match self.count {
            0 => 0,
            n => (n - 1) * self.stride + self.used_bytes(op, dtype),
        }
    }

    /// Appends the elements of `src` (laid out as `self`, [`span`](Self::span) bytes at
    /// least) to `out`, packed, in `order`.
    ///
    /// # Panics
    /// `src` shorter than the layout spans.
    pub fn gather(&self, op: Op, dtype: Dtype, src: &[u8], order: Order, out: &mut Vec<u8>) {
        let (w, elem) = (dtype.width(), element_bytes(op, dtype));
        let bytes = self.packed_bytes(op, dtype);
        let wire = wire_dtype(op, dtype, bytes);
        let packed = self.is_packed(op, dtype);
        out.reserve(bytes);
        for first in (0..self.count).step_by(CHUNK) {
            let n = CHUNK.min(self.count - first);
            let start = out.len();
            if packed {
                out.extend_from_slice(&src[first * elem..(first + n) * elem]);
            } else {
                for i in first..first + n {
                    let e = &src[i * self.stride..];
                    out.extend_from_slice(&e[..w]);
                    out.extend_from_slice(&e[self.loc_offset..self.loc_offset + LOC_BYTES]);
                }
            }
            if order == Order::Wire {
                swap_order(op, wire, &mut out[start..]);
            }
        }
    }

    /// Writes the packed message `packed` (in `order`; converted in place on the way) into
    /// `dst`, laid out as `self`; `dst`'s padding is left alone.
    ///
    /// # Panics
    /// `packed` not [`packed_bytes`](Self::packed_bytes) long, or `dst` shorter than the
    /// layout spans.
    pub fn scatter(&self, op: Op, dtype: Dtype, packed: &mut [u8], order: Order, dst: &mut [u8]) {
        let (w, elem) = (dtype.width(), element_bytes(op, dtype));
        assert_eq!(
            packed.len(),
            self.count * elem,
            "a packed message of the layout"
        );
        let wire = wire_dtype(op, dtype, packed.len());
        let is_packed = self.is_packed(op, dtype);
        for (c, chunk) in packed.chunks_mut(CHUNK * elem).enumerate() {
            if order == Order::Wire {
                swap_order(op, wire, chunk);
            }
            let first = c * CHUNK;
            if is_packed {
                dst[first * elem..first * elem + chunk.len()].copy_from_slice(chunk);
                continue;
            }
            for (k, e) in chunk.chunks_exact(elem).enumerate() {
                let q = &mut dst[(first + k) * self.stride..];
                q[..w].copy_from_slice(&e[..w]);
                q[self.loc_offset..self.loc_offset + LOC_BYTES].copy_from_slice(&e[w..]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `struct { double v; int loc; }` (16 bytes, location at 8) × `n`.
    fn padded_pairs(n: usize) -> (Strided, Vec<u8>) {
        let mut buf = vec![0xaau8; n * 16];
        for i in 0..n {
            buf[i * 16..i * 16 + 8].copy_from_slice(&(i as f64 * 0.5).to_ne_bytes());
            buf[i * 16 + 8..i * 16 + 12].copy_from_slice(&(i as i32).to_ne_bytes());
        }
        let layout = Strided {
            count: n,
            stride: 16,
            loc_offset: 8,
        };
        (layout, buf)
    }

    #[test]
    fn padded_pairs_pack_and_unpack_leaving_the_padding() {
        let n = 2 * CHUNK + 3;
        let (layout, src) = padded_pairs(n);
        assert!(!layout.is_packed(Op::Minloc, Dtype::F64));
        assert_eq!(layout.span(Op::Minloc, Dtype::F64), (n - 1) * 16 + 12);
        let mut native = vec![];
        layout.gather(Op::Minloc, Dtype::F64, &src, Order::Native, &mut native);
        assert_eq!(native.len(), n * 12);
        assert_eq!(&native[12..20], &0.5f64.to_ne_bytes());
        assert_eq!(&native[20..24], &1i32.to_ne_bytes());
        let mut wire = vec![];
        layout.gather(Op::Minloc, Dtype::F64, &src, Order::Wire, &mut wire);
        let mut expected = native.clone();
        swap_order(Op::Minloc, Dtype::F64, &mut expected);
        assert_eq!(wire, expected, "chunked conversion = whole conversion");
        let mut dst = vec![0x55u8; src.len()];
        layout.scatter(Op::Minloc, Dtype::F64, &mut wire, Order::Wire, &mut dst);
        for i in 0..n {
            assert_eq!(dst[i * 16..i * 16 + 12], src[i * 16..i * 16 + 12]);
            assert!(
                dst[i * 16 + 12..i * 16 + 16].iter().all(|&b| b == 0x55),
                "padding kept"
            );
        }
    }

    #[test]
    fn packed_bitwise_messages_convert_in_their_wire_words() {
        // 3 KiB + 8 of bytes under BOR travel as u64 words: chunks hold whole words.
        let n = 3 * CHUNK + 8;
        let src: Vec<u8> = (0..n).map(|i| i as u8).collect();
        let layout = Strided {
            count: n,
            stride: 1,
            loc_offset: 0,
        };
        assert!(layout.is_packed(Op::Bor, Dtype::U8));
        let mut wire = vec![];
        layout.gather(Op::Bor, Dtype::U8, &src, Order::Wire, &mut wire);
        let mut expected = src.clone();
        swap_order(Op::Bor, wire_dtype(Op::Bor, Dtype::U8, n), &mut expected);
        assert_eq!(wire, expected);
        let mut back = vec![0u8; n];
        layout.scatter(Op::Bor, Dtype::U8, &mut wire, Order::Wire, &mut back);
        assert_eq!(back, src);
    }
}
