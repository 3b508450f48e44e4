//! IEEE-754 binary16, bfloat16, binary32 and binary64 arithmetic with integers only, for BPF
//! (which has no floating-point instructions): addition and multiplication rounded to
//! nearest, ties to even, with signed zeros, subnormals, infinities and NaN; and the IEEE
//! 754-2019 `minimum`/`maximum`. Values are their bit patterns in a `u64` (narrower formats
//! in the low bits). No `u128`, no division, no panics: every function compiles to plain BPF.
//!
//! NaN: an operation with a NaN operand returns the first NaN operand, quieted; an invalid
//! operation (∞ − ∞, 0 × ∞) returns the default quiet NaN (`0x7ff8…`/`0x7fc0…`). Results
//! that are not NaN are bit for bit those of the host's IEEE arithmetic (tested below
//! against Rust's `f32`/`f64` on edge cases and random operands, and against the `half`
//! crate's `f16`/`bf16`, exhaustively in the first operand).

/// An IEEE-754 binary format.
pub trait Format {
    /// Width in bits (16, 32 or 64).
    const BITS: u32;
    /// Stored fraction bits (10, 7, 23 or 52).
    const FRAC: u32;
    /// Exponent bits (5, 8 or 11).
    const EXP: u32;
}

/// binary16 (`half::f16`).
pub struct F16;
/// bfloat16 (`half::bf16`): binary32 with its fraction cut to 7 bits.
pub struct BF16;
/// binary32 (`f32`).
pub struct F32;
/// binary64 (`f64`).
pub struct F64;

// The arithmetic needs FRAC ≥ 3 (`mul` shifts the product right by FRAC − 3) and a
// significand with its three rounding bits well inside a `u64`.
impl Format for F16 {
    const BITS: u32 = 16;
    const FRAC: u32 = 10;
    const EXP: u32 = 5;
}

impl Format for BF16 {
    const BITS: u32 = 16;
    const FRAC: u32 = 7;
    const EXP: u32 = 8;
}

impl Format for F32 {
    const BITS: u32 = 32;
    const FRAC: u32 = 23;
    const EXP: u32 = 8;
}

impl Format for F64 {
    const BITS: u32 = 64;
    const FRAC: u32 = 52;
    const EXP: u32 = 11;
}

const fn sign_bit<F: Format>() -> u64 {
    1 << (F::BITS - 1)
}
const fn abs_mask<F: Format>() -> u64 {
    sign_bit::<F>() - 1
}
const fn implicit<F: Format>() -> u64 {
    1 << F::FRAC
}
const fn frac_mask<F: Format>() -> u64 {
    implicit::<F>() - 1
}
const fn max_exp<F: Format>() -> i32 {
    (1 << F::EXP) - 1
}
const fn inf<F: Format>() -> u64 {
    (max_exp::<F>().cast_unsigned() as u64) << F::FRAC
}
const fn quiet<F: Format>() -> u64 {
    1 << (F::FRAC - 1)
}
/// The default quiet NaN.
#[must_use]
pub const fn default_nan<F: Format>() -> u64 {
    inf::<F>() | quiet::<F>()
}
const fn bias<F: Format>() -> i32 {
    (1 << (F::EXP - 1)) - 1
}

#[inline(always)]
fn is_nan<F: Format>(a: u64) -> bool {
    a & abs_mask::<F>() > inf::<F>()
}

/// The first NaN operand, quieted, if either is NaN.
#[inline(always)]
fn nan_operand<F: Format>(a: u64, b: u64) -> Option<u64> {
    if is_nan::<F>(a) {
        Some(a | quiet::<F>())
    } else if is_nan::<F>(b) {
        Some(b | quiet::<F>())
    } else {
        None
    }
}

/// A finite nonzero value's exponent field and significand with its implicit bit set
/// (a subnormal normalized: exponent `1 - shift`).
#[inline(always)]
fn unpack<F: Format>(a: u64) -> (i32, u64) {
    let exp = ((a >> F::FRAC) as i32) & max_exp::<F>();
    let mut sig = a & frac_mask::<F>();
    if exp == 0 {
        (normalize::<F>(&mut sig), sig)
    } else {
        (exp, sig | implicit::<F>())
    }
}

/// Shifts a subnormal significand up until its implicit bit is set; returns the exponent
/// it then has (`1 - shift`).
#[inline(always)]
fn normalize<F: Format>(sig: &mut u64) -> i32 {
    let shift = sig.leading_zeros() as i32 - implicit::<F>().leading_zeros() as i32;
    *sig <<= shift;
    1 - shift
}

/// `sig >> shift`, with every bit shifted out ORed into bit 0 (sticky).
#[inline(always)]
fn shift_right_sticky(sig: u64, shift: u32) -> u64 {
    if shift == 0 {
        sig
    } else if shift < 64 {
        (sig >> shift) | u64::from(sig & ((1u64 << shift) - 1) != 0)
    } else {
        u64::from(sig != 0)
    }
}

/// Packs a result: `sig` holds the significand (implicit bit at `FRAC + 3`) with three
/// extra bits (guard, round, sticky); rounds to nearest even; handles overflow and
/// subnormal results.
#[inline(always)]
fn round_pack<F: Format>(sign: u64, mut exp: i32, mut sig: u64) -> u64 {
    if exp >= max_exp::<F>() {
        return sign | inf::<F>();
    }
    if exp <= 0 {
        sig = shift_right_sticky(sig, (1 - exp).cast_unsigned());
        exp = 0;
    }
    let grs = sig & 7;
    // A subnormal has no implicit bit (the shift above cleared it) and exponent field 0.
    let mut result =
        sign | ((sig >> 3) & frac_mask::<F>()) | (u64::from(exp.cast_unsigned()) << F::FRAC);
    if grs > 4 || (grs == 4 && result & 1 != 0) {
        // A carry out of the fraction moves into the exponent, up to ∞: still right.
        result += 1;
    }
    result
}

/// `a + b`.
#[inline(always)]
#[must_use]
pub fn add<F: Format>(a: u64, b: u64) -> u64 {
    let (a_abs, b_abs) = (a & abs_mask::<F>(), b & abs_mask::<F>());
    let inf = inf::<F>();
    // Zero, ∞ or NaN on either side.
    if a_abs.wrapping_sub(1) >= inf - 1 || b_abs.wrapping_sub(1) >= inf - 1 {
        if let Some(nan) = nan_operand::<F>(a, b) {
            return nan;
        }
        if a_abs == inf {
            return if (a ^ b) == sign_bit::<F>() {
                default_nan::<F>()
            } else {
                a
            };
        }
        if b_abs == inf {
            return b;
        }
        if a_abs == 0 {
            // −0 + −0 = −0; +0 + −0 = +0 (round to nearest).
            return if b_abs == 0 { a & b } else { b };
        }
        return a;
    }
    // `a` has the larger magnitude.
    let (a, b) = if b_abs > a_abs { (b, a) } else { (a, b) };
    let (mut a_exp, a_sig) = unpack::<F>(a);
    let (b_exp, b_sig) = unpack::<F>(b);
    let sign = a & sign_bit::<F>();
    let subtract = (a ^ b) & sign_bit::<F>() != 0;
    let top = implicit::<F>() << 3;
    let mut a_sig = a_sig << 3;
    let b_sig = shift_right_sticky(b_sig << 3, (a_exp - b_exp).cast_unsigned());
    if subtract {
        a_sig -= b_sig;
        if a_sig == 0 {
            return 0;
        }
        if a_sig < top {
            let shift = a_sig.leading_zeros() as i32 - top.leading_zeros() as i32;
            a_sig <<= shift;
            a_exp -= shift;
        }
    } else {
        a_sig += b_sig;
        if a_sig & (top << 1) != 0 {
            a_sig = shift_right_sticky(a_sig, 1);
            a_exp += 1;
        }
    }
    round_pack::<F>(sign, a_exp, a_sig)
}

/// The full 128-bit product of two 64-bit numbers, as (high, low), from 32-bit halves
/// (BPF has no 128-bit multiply).
#[inline(always)]
fn mul_wide(a: u64, b: u64) -> (u64, u64) {
    let (a_lo, a_hi) = (a & 0xffff_ffff, a >> 32);
    let (b_lo, b_hi) = (b & 0xffff_ffff, b >> 32);
    let ll = a_lo * b_lo;
    let lh = a_lo * b_hi;
    let hl = a_hi * b_lo;
    let hh = a_hi * b_hi;
    let mid = (ll >> 32) + (lh & 0xffff_ffff) + (hl & 0xffff_ffff);
    let lo = (ll & 0xffff_ffff) | (mid << 32);
    let hi = hh + (lh >> 32) + (hl >> 32) + (mid >> 32);
    (hi, lo)
}

/// `a × b`.
#[inline(always)]
#[must_use]
pub fn mul<F: Format>(a: u64, b: u64) -> u64 {
    let (a_abs, b_abs) = (a & abs_mask::<F>(), b & abs_mask::<F>());
    let inf = inf::<F>();
    let sign = (a ^ b) & sign_bit::<F>();
    if a_abs.wrapping_sub(1) >= inf - 1 || b_abs.wrapping_sub(1) >= inf - 1 {
        if let Some(nan) = nan_operand::<F>(a, b) {
            return nan;
        }
        if a_abs == inf {
            return if b_abs == 0 {
                default_nan::<F>()
            } else {
                sign | inf
            };
        }
        if b_abs == inf {
            return if a_abs == 0 {
                default_nan::<F>()
            } else {
                sign | inf
            };
        }
        // A zero.
        return sign;
    }
    let (a_exp, a_sig) = unpack::<F>(a);
    let (b_exp, b_sig) = unpack::<F>(b);
    // Significands in [2^FRAC, 2^(FRAC+1)): the product is in [2^(2·FRAC), 2^(2·FRAC+2)).
    let (hi, lo) = mul_wide(a_sig, b_sig);
    let mut exp = a_exp + b_exp - bias::<F>();
    // Keep FRAC + 1 significant bits and 3 more (guard, round, sticky): shift the product
    // right by FRAC − 3 (+1 when it has its top bit at 2·FRAC + 1).
    let top = 2 * F::FRAC + 1;
    let wide = if top >= 64 {
        (hi >> (top - 64)) & 1
    } else {
        (lo >> top) & 1
    } != 0;
    let shift = F::FRAC - 3 + u32::from(wide);
    exp += i32::from(wide);
    let sig = shift_right_128_sticky(hi, lo, shift);
    round_pack::<F>(sign, exp, sig)
}

/// `(hi:lo) >> shift` (`0 < shift < 64`: `mul` shifts by FRAC − 3 or FRAC − 2) with the
/// bits shifted out ORed into bit 0; the result fits in 64 bits for those shifts.
#[inline(always)]
fn shift_right_128_sticky(hi: u64, lo: u64, shift: u32) -> u64 {
    let out = lo & ((1u64 << shift) - 1) != 0;
    (lo >> shift) | (hi << (64 - shift)) | u64::from(out)
}

/// IEEE 754-2019 `minimum`: NaN if either is NaN (the first NaN, quieted), −0 below +0.
/// Commutative for every non-NaN pair, so a reduction's result does not depend on order.
#[inline(always)]
#[must_use]
pub fn minimum<F: Format>(a: u64, b: u64) -> u64 {
    if let Some(nan) = nan_operand::<F>(a, b) {
        return nan;
    }
    if less::<F>(b, a) { b } else { a }
}

/// IEEE 754-2019 `maximum`: NaN if either is NaN (the first NaN, quieted), +0 above −0.
#[inline(always)]
#[must_use]
pub fn maximum<F: Format>(a: u64, b: u64) -> u64 {
    if let Some(nan) = nan_operand::<F>(a, b) {
        return nan;
    }
    if less::<F>(a, b) { b } else { a }
}

/// MPI `MINLOC` (`min` true) or `MAXLOC` on (value, location) pairs: the value is
/// [`minimum`] (or [`maximum`]) of the two, the location that of the operand it came from;
/// equal values (same bits) take the smaller location, a NaN takes its own (the first's when
/// both are NaN).
#[inline(always)]
#[must_use]
pub fn select_loc<F: Format>(min: bool, (a, la): (u64, i32), (b, lb): (u64, i32)) -> (u64, i32) {
    if let Some(nan) = nan_operand::<F>(a, b) {
        return (nan, if is_nan::<F>(a) { la } else { lb });
    }
    if a == b {
        return (a, if lb < la { lb } else { la });
    }
    let b_wins = if min {
        less::<F>(b, a)
    } else {
        less::<F>(a, b)
    };
    if b_wins { (b, lb) } else { (a, la) }
}

/// Total order on non-NaN values with −0 < +0: `a < b`.
#[inline(always)]
fn less<F: Format>(a: u64, b: u64) -> bool {
    let (a_neg, b_neg) = (a & sign_bit::<F>() != 0, b & sign_bit::<F>() != 0);
    let (a_abs, b_abs) = (a & abs_mask::<F>(), b & abs_mask::<F>());
    match (a_neg, b_neg) {
        (true, false) => true,
        (false, true) => false,
        (false, false) => a_abs < b_abs,
        (true, true) => a_abs > b_abs,
    }
}

#[cfg(test)]
#[expect(
    clippy::cast_sign_loss,
    clippy::float_cmp,
    reason = "tests build bit patterns from small positive exponents and compare floats exactly on purpose"
)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;

    /// Edge values of a format: zeros, subnormals, normals at the ends, ones, ∞, NaNs.
    fn edges<F: Format>() -> Vec<u64> {
        let s = sign_bit::<F>();
        let mut v = std::vec![
            0,
            1,
            2,
            3,
            frac_mask::<F>(),
            frac_mask::<F>() - 1,
            implicit::<F>(),
            implicit::<F>() + 1,
            inf::<F>() - 1,
            inf::<F>() - 2,
            (bias::<F>() as u64) << F::FRAC,
            ((bias::<F>() as u64) << F::FRAC) + 1,
            ((bias::<F>() as u64) << F::FRAC) - 1,
            ((bias::<F>() as u64 + 1) << F::FRAC) | (1 << (F::FRAC - 1)),
            ((F::FRAC as u64 + 2) << F::FRAC) | 5,
            inf::<F>(),
            default_nan::<F>(),
            inf::<F>() | 1,
        ];
        let neg: Vec<u64> = v.iter().map(|x| x | s).collect();
        v.extend(neg);
        v
    }

    /// A deterministic xorshift generator.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    /// Random operands: raw bit patterns, and pairs with exponents close together (where
    /// cancellation and rounding happen).
    #[expect(clippy::many_single_char_names, reason = "a, b, e, i, r: the usual")]
    fn pairs<F: Format>(n: usize, seed: u64) -> Vec<(u64, u64)> {
        let mask = u64::MAX >> (64 - F::BITS);
        let mut r = Rng(seed);
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let a = r.next() & mask;
            let mut b = r.next() & mask;
            if i % 2 == 1 {
                // Same exponent as `a`, give or take a few.
                let exp_field = (a >> F::FRAC) & (max_exp::<F>() as u64);
                let delta = (r.next() % 5) as i64 - 2;
                let e = (exp_field as i64 + delta).clamp(0, i64::from(max_exp::<F>()) - 1) as u64;
                b = (b & (sign_bit::<F>() | frac_mask::<F>())) | (e << F::FRAC);
            }
            out.push((a, b));
        }
        out
    }

    fn iterations() -> usize {
        std::env::var("INNET_SOFTFLOAT_PAIRS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(200_000)
    }

    fn check64(op: &str, a: u64, b: u64, ours: u64, host: f64) {
        if host.is_nan() {
            assert!(
                f64::from_bits(ours).is_nan(),
                "{op} {a:#x} {b:#x}: {ours:#x}, want NaN"
            );
        } else {
            assert_eq!(
                ours,
                host.to_bits(),
                "{op} {a:#018x} {b:#018x}: {ours:#018x}, want {:#018x}",
                host.to_bits()
            );
        }
    }

    fn check32(op: &str, a: u64, b: u64, ours: u64, host: f32) {
        if host.is_nan() {
            assert!(
                f32::from_bits(ours as u32).is_nan(),
                "{op} {a:#x} {b:#x}: {ours:#x}, want NaN"
            );
        } else {
            assert_eq!(
                ours,
                u64::from(host.to_bits()),
                "{op} {a:#010x} {b:#010x}: {ours:#010x}, want {:#010x}",
                host.to_bits()
            );
        }
    }

    fn all64() -> Vec<(u64, u64)> {
        let e = edges::<F64>();
        let mut v: Vec<(u64, u64)> = e
            .iter()
            .flat_map(|&a| e.iter().map(move |&b| (a, b)))
            .collect();
        v.extend(pairs::<F64>(iterations(), 0x9e37_79b9_7f4a_7c15));
        v
    }

    fn all32() -> Vec<(u64, u64)> {
        let e = edges::<F32>();
        let mut v: Vec<(u64, u64)> = e
            .iter()
            .flat_map(|&a| e.iter().map(move |&b| (a, b)))
            .collect();
        v.extend(pairs::<F32>(iterations(), 0x2545_f491_4f6c_dd1d));
        v
    }

    #[test]
    fn f64_add_and_mul_match_the_host_bit_for_bit() {
        for (a, b) in all64() {
            let (x, y) = (f64::from_bits(a), f64::from_bits(b));
            check64("add", a, b, add::<F64>(a, b), x + y);
            check64("mul", a, b, mul::<F64>(a, b), x * y);
        }
    }

    #[test]
    fn f32_add_and_mul_match_the_host_bit_for_bit() {
        for (a, b) in all32() {
            let (x, y) = (f32::from_bits(a as u32), f32::from_bits(b as u32));
            check32("add", a, b, add::<F32>(a, b), x + y);
            check32("mul", a, b, mul::<F32>(a, b), x * y);
        }
    }

    /// IEEE 754-2019 `minimum` with the host's comparisons (`f64::minimum` is unstable).
    macro_rules! host_minimum {
        ($x:expr, $y:expr) => {{
            let (x, y) = ($x, $y);
            if x.is_nan() || y.is_nan() {
                x + y
            } else if x < y || (x == y && x.is_sign_negative()) {
                x
            } else {
                y
            }
        }};
    }

    macro_rules! host_maximum {
        ($x:expr, $y:expr) => {{
            let (x, y) = ($x, $y);
            if x.is_nan() || y.is_nan() {
                x + y
            } else if x > y || (x == y && x.is_sign_positive()) {
                x
            } else {
                y
            }
        }};
    }

    #[test]
    fn minimum_and_maximum_follow_ieee_2019_and_commute() {
        for (a, b) in all64() {
            let (x, y) = (f64::from_bits(a), f64::from_bits(b));
            check64("minimum", a, b, minimum::<F64>(a, b), host_minimum!(x, y));
            check64("maximum", a, b, maximum::<F64>(a, b), host_maximum!(x, y));
            if !x.is_nan() && !y.is_nan() {
                assert_eq!(minimum::<F64>(a, b), minimum::<F64>(b, a));
                assert_eq!(maximum::<F64>(a, b), maximum::<F64>(b, a));
            }
        }
        for (a, b) in all32() {
            let (x, y) = (f32::from_bits(a as u32), f32::from_bits(b as u32));
            check32("minimum", a, b, minimum::<F32>(a, b), host_minimum!(x, y));
            check32("maximum", a, b, maximum::<F32>(a, b), host_maximum!(x, y));
        }
    }

    #[test]
    fn nan_operands_come_back_quieted_and_invalid_operations_give_the_default_nan() {
        let snan = inf::<F64>() | 1;
        assert_eq!(add::<F64>(snan, 0), snan | quiet::<F64>());
        assert_eq!(mul::<F64>(1.0f64.to_bits(), snan), snan | quiet::<F64>());
        let (p, n) = (inf::<F64>(), inf::<F64>() | sign_bit::<F64>());
        assert_eq!(add::<F64>(p, n), default_nan::<F64>());
        assert_eq!(mul::<F64>(p, 0), default_nan::<F64>());
    }

    /// The 16-bit formats against the `half` crate (whose arithmetic goes through `f32`):
    /// every first operand against the edge values and a fixed random set of second
    /// operands, then random pairs.
    macro_rules! half_matches_host {
        ($name:ident, $fmt:ty, $half:ty) => {
            #[test]
            fn $name() {
                let to = |v: u64| <$half>::from_bits(v as u16).to_f32();
                let check = |op: &str, a: u64, b: u64, ours: u64, host: f32| {
                    let want = <$half>::from_f32(host);
                    if want.is_nan() {
                        assert!(
                            <$half>::from_bits(ours as u16).is_nan(),
                            "{op} {a:#06x} {b:#06x}: {ours:#06x}, want NaN"
                        );
                    } else {
                        assert_eq!(
                            ours,
                            u64::from(want.to_bits()),
                            "{op} {a:#06x} {b:#06x}: {ours:#06x}, want {:#06x}",
                            want.to_bits()
                        );
                    }
                };
                let one = |a: u64, b: u64| {
                    let (x, y) = (to(a), to(b));
                    // half's own operators: f32 arithmetic rounded back to the format.
                    let host = |v: $half| v.to_f32();
                    let (ha, hb) = (<$half>::from_bits(a as u16), <$half>::from_bits(b as u16));
                    check("add", a, b, add::<$fmt>(a, b), host(ha + hb));
                    check("mul", a, b, mul::<$fmt>(a, b), host(ha * hb));
                    check("minimum", a, b, minimum::<$fmt>(a, b), host_minimum!(x, y));
                    check("maximum", a, b, maximum::<$fmt>(a, b), host_maximum!(x, y));
                };
                let mut seconds = edges::<$fmt>();
                seconds.extend(
                    pairs::<$fmt>(64, 0x51_7cc1_b727_220a)
                        .into_iter()
                        .map(|p| p.1),
                );
                for a in 0..=u64::from(u16::MAX) {
                    for &b in &seconds {
                        one(a, b);
                    }
                }
                for (a, b) in pairs::<$fmt>(iterations(), 0x2545_f491_4f6c_dd1d) {
                    one(a, b);
                }
            }
        };
    }

    half_matches_host!(f16_matches_the_half_crate, F16, half::f16);
    half_matches_host!(bf16_matches_the_half_crate, BF16, half::bf16);

    #[test]
    fn half_rounding_ties_go_to_even() {
        // 1 + 2^-11 lies halfway between 1 and the next binary16 (1 + 2^-10): even is 1;
        // 1 + 3·2^-11 halfway between 1 + 2^-10 and 1 + 2^-9: even is the latter.
        let one = 0x3c00u64;
        let half_ulp = 0x1000u64; // 2^-11
        assert_eq!(add::<F16>(one, half_ulp), one);
        assert_eq!(add::<F16>(0x3c01, half_ulp), 0x3c02);
        // Largest finite binary16 65504 plus half its ulp (16) rounds to ∞.
        assert_eq!(add::<F16>(0x7bff, 0x4c00), inf::<F16>());
        // bfloat16: 1 + 2^-8 is a tie (ulp 2^-7) and rounds to 1.
        assert_eq!(add::<BF16>(0x3f80, 0x3b80), 0x3f80);
        assert_eq!(add::<BF16>(0x3f81, 0x3b80), 0x3f82);
        // The smallest subnormals: 2^-24 · 2^-1 is a tie between 0 and 2^-24: even is 0.
        assert_eq!(mul::<F16>(1, 0x3800), 0);
        assert_eq!(mul::<F16>(3, 0x3800), 2);
    }

    #[test]
    fn wide_multiplication_is_exact() {
        let mut r = Rng(7);
        for _ in 0..10_000 {
            let (a, b) = (r.next(), r.next());
            let want = u128::from(a) * u128::from(b);
            assert_eq!(mul_wide(a, b), ((want >> 64) as u64, want as u64));
        }
    }
}
