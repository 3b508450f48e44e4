//! Host allreduce among the leaders: recursive doubling and ring. They are the fallback when
//! the network cannot reduce, and the baseline the benchmarks compare against. Both work on
//! wire-order buffers through an [`Exchange`], so they run the same over UDP and in memory.
//!
//! Any message may instead be answered with the collective's final result (a peer that
//! already has it, because the network delivered it there): the algorithm then stops with
//! that result, which equals what it would have computed (integer ops are exact).

use innet_common::{
    proto::{Dtype, Op, element_bytes},
    reduce::{ReduceError, combine_after, combine_into},
};

/// Which host algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Algorithm {
    /// `log2(n)` exchanges of the whole message: best for small messages.
    RecursiveDoubling,
    /// Reduce-scatter then allgather, `2(n − 1)` steps of `1/n` of the message: best for
    /// long messages.
    Ring,
}

impl Algorithm {
    /// MPI libraries switch to the ring around this size.
    pub const RING_FROM_BYTES: usize = 64 * 1024;

    /// The algorithm for a message of `bytes` (the same choice on every leader).
    #[must_use]
    pub fn for_bytes(bytes: usize) -> Self {
        if bytes >= Self::RING_FROM_BYTES {
            Self::Ring
        } else {
            Self::RecursiveDoubling
        }
    }
}

/// What arrives for a step.
pub enum Received {
    /// The partner's data for this step.
    Data(Vec<u8>),
    /// The collective's final result, from a peer that has it.
    Final(Vec<u8>),
}

/// Point-to-point messages between leaders, for one collective.
pub trait Exchange {
    type Error: From<ReduceError>;
    /// Sends `data` (may be empty) to leader `to` as step `step`.
    ///
    /// # Errors
    /// Transport errors.
    fn send(&mut self, to: usize, step: u8, data: &[u8]) -> Result<(), Self::Error>;
    /// Receives leader `from`'s step `step` message of `len` bytes.
    ///
    /// # Errors
    /// Transport errors or timeout.
    fn recv(&mut self, from: usize, step: u8, len: usize) -> Result<Received, Self::Error>;
}

/// Runs `algorithm` for leader `me` of `n`: `buf` holds this leader's contribution and ends
/// holding the result.
///
/// # Errors
/// The exchange's errors, or a reduction error.
pub fn allreduce<X: Exchange>(
    algorithm: Algorithm,
    x: &mut X,
    me: usize,
    n: usize,
    op: Op,
    dtype: Dtype,
    buf: &mut [u8],
) -> Result<(), X::Error> {
    if n <= 1 {
        return Ok(());
    }
    match algorithm {
        Algorithm::RecursiveDoubling => recursive_doubling(x, me, n, op, dtype, buf),
        Algorithm::Ring => ring(x, me, n, op, dtype, buf),
    }
}

/// Step numbers of recursive doubling: the fold-in of extra leaders, the exchanges, the
/// hand-back.
const RD_FOLD: u8 = 0;
const RD_BACK: u8 = 0x80;

/// MPICH's recursive doubling: with `n = 2^k + r`, the first `2r` leaders pair up so that
/// `2^k` take part in the exchanges; the others get the result at the end.
fn recursive_doubling<X: Exchange>(
    x: &mut X,
    me: usize,
    n: usize,
    op: Op,
    dtype: Dtype,
    buf: &mut [u8],
) -> Result<(), X::Error> {
    let pof2 = 1 << n.ilog2();
    let rem = n - pof2;
    let len = buf.len();
    // Leaders below 2r: even ones hand their data to the next odd one and wait.
    let new_rank = if me < 2 * rem {
        if me.is_multiple_of(2) {
            x.send(me + 1, RD_FOLD, buf)?;
            let (Received::Data(r) | Received::Final(r)) = x.recv(me + 1, RD_BACK, len)?;
            buf.copy_from_slice(&r);
            return Ok(());
        }
        match x.recv(me - 1, RD_FOLD, len)? {
            Received::Data(d) => combine_after(op, dtype, buf, &d)?,
            Received::Final(f) => return finish(x, me, rem, buf, &f),
        }
        me / 2
    } else {
        me - rem
    };
    let real = |r: usize| if r < rem { r * 2 + 1 } else { r + rem };
    let mut mask = 1;
    let mut step = 1u8;
    while mask < pof2 {
        let partner = real(new_rank ^ mask);
        x.send(partner, step, buf)?;
        match x.recv(partner, step, len)? {
            // Lower rank on the left, so both partners hold the same bits.
            Received::Data(d) if partner < me => combine_after(op, dtype, buf, &d)?,
            Received::Data(d) => combine_into(op, dtype, buf, &d)?,
            Received::Final(f) => return finish(x, me, rem, buf, &f),
        }
        mask <<= 1;
        step += 1;
    }
    if me < 2 * rem {
        x.send(me - 1, RD_BACK, buf)?;
    }
    Ok(())
}

/// Stops with a final result another leader supplied; still hands it back to a folded-in
/// partner that waits for it.
fn finish<X: Exchange>(
    x: &mut X,
    me: usize,
    rem: usize,
    buf: &mut [u8],
    f: &[u8],
) -> Result<(), X::Error> {
    buf.copy_from_slice(f);
    if me < 2 * rem && !me.is_multiple_of(2) {
        x.send(me - 1, RD_BACK, buf)?;
    }
    Ok(())
}

/// Chunk `c` of `n` as a byte range, on element boundaries.
fn chunk(len: usize, elem: usize, n: usize, c: usize) -> std::ops::Range<usize> {
    let count = len / elem;
    let (base, extra) = (count / n, count % n);
    let start = c * base + c.min(extra);
    let end = start + base + usize::from(c < extra);
    start * elem..end * elem
}

/// Step numbers an algorithm may use; the transport keeps the ones above for itself.
pub const ALGORITHM_STEPS: usize = 0xfc;

/// Most bytes a leader sends in one ring step. A step's message leaves in one burst, and
/// the receiver's socket buffer (4 MiB) must hold it whole: a 16 MiB step (a 64 MiB
/// message over 4 leaders) overran it and cost a retransmission round per step (host-ring
/// ran 11 MB/s at 64 MiB against 43 at 1 MiB). MPI libraries segment their rings alike.
pub const RING_STEP_BYTES: usize = 1 << 20;

/// Ring allreduce: reduce-scatter (`n − 1` steps) then allgather (`n − 1` steps), over
/// consecutive pieces of the message small enough that no step sends more than
/// [`RING_STEP_BYTES`] (as many pieces as the step numbers allow).
fn ring<X: Exchange>(
    x: &mut X,
    me: usize,
    n: usize,
    op: Op,
    dtype: Dtype,
    buf: &mut [u8],
) -> Result<(), X::Error> {
    let elem = element_bytes(op, dtype);
    let len = buf.len();
    let steps = 2 * (n - 1);
    let pieces = ring_pieces(len, n);
    for k in 0..pieces {
        let piece = chunk(len, elem, pieces, k);
        let first_step = (k * steps) as u8;
        if let Some(f) = ring_piece(x, (me, n), (op, dtype), &mut buf[piece], first_step)? {
            buf.copy_from_slice(&f);
            return Ok(());
        }
    }
    Ok(())
}

/// How many pieces [`ring`] runs a message of `len` bytes over `n` leaders in.
fn ring_pieces(len: usize, n: usize) -> usize {
    len.div_ceil(n * RING_STEP_BYTES)
        .clamp(1, (ALGORITHM_STEPS / (2 * (n - 1))).max(1))
}

/// The size of every message leader `me` of `n` sends in a ring allreduce of `len` bytes
/// of `elem`-byte elements, in order (for counting its packets).
#[must_use]
#[cfg_attr(
    not(any(feature = "test-hooks", test)),
    expect(dead_code, reason = "innet-lab counts a ring's packets with it")
)]
pub fn ring_messages(len: usize, elem: usize, n: usize, me: usize) -> Vec<usize> {
    if n <= 1 {
        return vec![];
    }
    let pieces = ring_pieces(len, n);
    let mut sizes = Vec::with_capacity(pieces * 2 * (n - 1));
    for k in 0..pieces {
        let piece = chunk(len, elem, pieces, k).len();
        sizes.extend((0..2 * (n - 1)).map(|s| chunk(piece, elem, n, sent_chunk(me, n, s)).len()));
    }
    sizes
}

/// The chunk leader `me` of `n` sends in step `s` of a ring piece (`0 .. 2(n − 1)`): in
/// the reduce-scatter the one it has just combined, in the allgather the one it has just
/// completed.
fn sent_chunk(me: usize, n: usize, s: usize) -> usize {
    if s < n - 1 {
        (me + n - s) % n
    } else {
        (me + 1 + n - (s - (n - 1))) % n
    }
}

/// One piece of [`ring`], its steps numbered from `first_step`. Returns the collective's
/// final result instead when a peer answered with it.
fn ring_piece<X: Exchange>(
    x: &mut X,
    (me, n): (usize, usize),
    (op, dtype): (Op, Dtype),
    buf: &mut [u8],
    first_step: u8,
) -> Result<Option<Vec<u8>>, X::Error> {
    let elem = element_bytes(op, dtype);
    let len = buf.len();
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    for s in 0..n - 1 {
        let send = chunk(len, elem, n, sent_chunk(me, n, s));
        let recv = chunk(len, elem, n, (me + 2 * n - s - 1) % n);
        let step = first_step.wrapping_add(s as u8);
        x.send(next, step, &buf[send])?;
        match x.recv(prev, step, recv.len())? {
            Received::Data(d) => combine_into(op, dtype, &mut buf[recv], &d)?,
            Received::Final(f) => return Ok(Some(f)),
        }
    }
    for s in 0..n - 1 {
        let send = chunk(len, elem, n, sent_chunk(me, n, n - 1 + s));
        let recv = chunk(len, elem, n, (me + n - s) % n);
        let step = first_step.wrapping_add((n - 1 + s) as u8);
        x.send(next, step, &buf[send])?;
        match x.recv(prev, step, recv.len())? {
            Received::Data(d) => buf[recv].copy_from_slice(&d),
            Received::Final(f) => return Ok(Some(f)),
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use std::{
        collections::HashMap,
        sync::mpsc::{Receiver, Sender, channel},
    };

    use innet_common::reduce::reduce_all;

    use super::*;

    /// In-memory exchange: one channel per leader; messages are keyed by (from, step).
    struct Mem {
        me: usize,
        tx: Vec<Sender<(usize, u8, Vec<u8>)>>,
        rx: Receiver<(usize, u8, Vec<u8>)>,
        early: HashMap<(usize, u8), Vec<u8>>,
    }

    impl Exchange for Mem {
        type Error = ReduceError;
        fn send(&mut self, to: usize, step: u8, data: &[u8]) -> Result<(), ReduceError> {
            self.tx[to].send((self.me, step, data.to_vec())).unwrap();
            Ok(())
        }
        fn recv(&mut self, from: usize, step: u8, len: usize) -> Result<Received, ReduceError> {
            loop {
                if let Some(d) = self.early.remove(&(from, step)) {
                    assert_eq!(d.len(), len, "step {step} from {from}");
                    return Ok(Received::Data(d));
                }
                let (f, s, d) = self.rx.recv().unwrap();
                self.early.insert((f, s), d);
            }
        }
    }

    fn run(algorithm: Algorithm, n: usize, op: Op, dtype: Dtype, count: usize) {
        let size = count * element_bytes(op, dtype);
        let inputs: Vec<Vec<u8>> = (0..n)
            .map(|i| (0..size).map(|b| (i * 37 + b * 11 + 1) as u8).collect())
            .collect();
        run_inputs(algorithm, op, dtype, &inputs);
    }

    /// Every leader ends with the reference result of `inputs` (one per leader).
    fn run_inputs(algorithm: Algorithm, op: Op, dtype: Dtype, inputs: &[Vec<u8>]) {
        let n = inputs.len();
        let count = inputs[0].len() / element_bytes(op, dtype);
        let inputs = inputs.to_vec();
        let expected = reduce_all(op, dtype, &inputs).unwrap();
        let (tx, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| channel()).unzip();
        let handles: Vec<_> = rxs
            .into_iter()
            .enumerate()
            .map(|(me, rx)| {
                let mut x = Mem {
                    me,
                    tx: tx.clone(),
                    rx,
                    early: HashMap::new(),
                };
                let mut buf = inputs[me].clone();
                std::thread::spawn(move || {
                    allreduce(algorithm, &mut x, me, n, op, dtype, &mut buf).unwrap();
                    buf
                })
            })
            .collect();
        for (i, h) in handles.into_iter().enumerate() {
            assert_eq!(
                h.join().unwrap(),
                expected,
                "{algorithm:?} n={n} {op:?}/{dtype:?} count={count}: leader {i}"
            );
        }
    }

    #[test]
    fn recursive_doubling_matches_the_reference_for_any_leader_count() {
        for n in 1..=12 {
            run(Algorithm::RecursiveDoubling, n, Op::Sum, Dtype::I32, 7);
            run(Algorithm::RecursiveDoubling, n, Op::Minloc, Dtype::I16, 3);
        }
    }

    #[test]
    fn ring_matches_the_reference_even_with_fewer_elements_than_leaders() {
        for n in 1..=12 {
            for count in [1, 5, 64, 1000] {
                run(Algorithm::Ring, n, Op::Sum, Dtype::U64, count);
            }
            run(Algorithm::Ring, n, Op::Maxloc, Dtype::I32, 9);
            run(Algorithm::Ring, n, Op::Bxor, Dtype::U8, 33);
        }
    }

    /// Half floats through both algorithms. Their partial results combine in another order
    /// than the reference's, so the inputs are small integers, whose sums and products
    /// every order gets exactly (up to 2^11 in binary16, 2^8 in bfloat16).
    #[test]
    fn half_types_reduce_through_both_algorithms() {
        let wire = |dtype: Dtype, v: f32| match dtype {
            Dtype::F16 => half::f16::from_f32(v).to_be_bytes(),
            _ => half::bf16::from_f32(v).to_be_bytes(),
        };
        for dtype in [Dtype::F16, Dtype::BF16] {
            for op in [Op::Sum, Op::Prod, Op::Min, Op::Max] {
                for n in [1, 3, 5, 8] {
                    for count in [1, 7, 300] {
                        let inputs: Vec<Vec<u8>> = (0..n)
                            .map(|i| {
                                (0..count)
                                    .flat_map(|k| {
                                        let v = ((i * 7 + k * 3) % 5) as f32 - 2.0;
                                        let v = if op == Op::Prod && v == 0.0 { 1.0 } else { v };
                                        wire(dtype, v)
                                    })
                                    .collect()
                            })
                            .collect();
                        for algorithm in [Algorithm::RecursiveDoubling, Algorithm::Ring] {
                            run_inputs(algorithm, op, dtype, &inputs);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn ring_runs_a_long_message_in_pieces_with_steps_of_their_own() {
        // Three pieces of about 2 MiB over 3 leaders: each step stays under the cap, and a
        // step number used twice would hand a piece another piece's data.
        let count = (5 * 3 * RING_STEP_BYTES / 2 + 40) / 8;
        run(Algorithm::Ring, 3, Op::Sum, Dtype::U64, count);
    }

    #[test]
    fn ring_messages_add_up_to_two_n_minus_one_nths_of_the_message() {
        for (len, n) in [(8 << 20, 4), (1000 * 8, 3), (64 << 20, 16)] {
            for me in 0..n {
                let sent: usize = ring_messages(len, 8, n, me).iter().sum();
                let expected = 2 * (n - 1) * len / n;
                assert!(sent.abs_diff(expected) <= 2 * (n - 1) * 8 * ring_pieces(len, n));
            }
        }
    }

    #[test]
    fn chunks_tile_the_buffer() {
        for (len, elem, n) in [(40, 4, 3), (8, 8, 5), (1000, 2, 7)] {
            let mut next = 0;
            for c in 0..n {
                let r = chunk(len, elem, n, c);
                assert_eq!(r.start, next);
                assert_eq!(r.len() % elem, 0);
                next = r.end;
            }
            assert_eq!(next, len);
        }
    }
}
