//! Allgather and reduce-scatter through the same tree as the allreduce.
//!
//! An allgather is an allreduce of the concatenated blocks under bitwise OR: each rank
//! gives a message that is zero but for its own block at its offset, so the OR of all of
//! them is every block in rank order, whatever the data (OR with zero keeps every bit).
//! A reduce-scatter is an allreduce of the whole message, of which each rank keeps its
//! part. Both run on every path the allreduce runs on, falling back to the hosts the same
//! way, with the same [`Report`].

use innet_common::proto::{Dtype, Op, element_bytes};

use super::{Core, Error, Report};
use crate::element::Element;

impl Core {
    /// The handle's [`Communicator::allgather_bytes`](crate::Communicator::allgather_bytes), on the core.
    pub fn allgather_bytes(&mut self, send: &[u8], recv: &mut [u8]) -> Result<Report, Error> {
        let (block, size) = (send.len(), self.size());
        if recv.len() != block * size {
            return Err(Error::GatherBuffer {
                block,
                size,
                recv: recv.len(),
            });
        }
        let own = self.rank() * block..(self.rank() + 1) * block;
        let only_own = |r: &mut [u8]| {
            r.fill(0);
            r[own.clone()].copy_from_slice(send);
        };
        only_own(recv);
        self.allreduce_in_place(recv, Op::Bor, Dtype::U8, only_own)
    }

    /// The handle's [`Communicator::allgather`](crate::Communicator::allgather), on the core.
    pub fn allgather<T: Element>(&mut self, send: &[T], recv: &mut [T]) -> Result<Report, Error> {
        let (block, size) = (send.len(), self.size());
        if recv.len() != block * size {
            return Err(Error::GatherBuffer {
                block,
                size,
                recv: recv.len(),
            });
        }
        T::as_bytes(send, recv, |s, r| self.allgather_bytes(s, r))
    }

    /// The handle's [`Communicator::reduce_scatter_bytes`](crate::Communicator::reduce_scatter_bytes), on the core.
    pub fn reduce_scatter_bytes(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        counts: &[usize],
        op: Op,
        dtype: Dtype,
    ) -> Result<Report, Error> {
        let part = self.scatter_part(counts, send.len(), recv.len(), element_bytes(op, dtype))?;
        let mut full = std::mem::take(&mut self.scatter);
        full.resize(send.len(), 0);
        let report = self.allreduce_bytes(send, &mut full, op, dtype);
        if report.is_ok() {
            recv.copy_from_slice(&full[part]);
        }
        self.scatter = full;
        report
    }

    /// The handle's [`Communicator::reduce_scatter`](crate::Communicator::reduce_scatter), on the core.
    pub fn reduce_scatter<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        op: Op,
    ) -> Result<Report, Error> {
        if op.carries_location() != T::LOC {
            return Err(Error::LocElements { op });
        }
        self.scatter_part(counts, send.len(), recv.len(), 1)?;
        T::as_bytes(send, recv, |s, r| {
            self.reduce_scatter_bytes(s, r, counts, op, T::DTYPE)
        })
    }

    /// The handle's [`Communicator::reduce_scatter_block`](crate::Communicator::reduce_scatter_block), on the core.
    pub fn reduce_scatter_block<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        op: Op,
    ) -> Result<Report, Error> {
        let counts = vec![recv.len(); self.size()];
        self.reduce_scatter(send, recv, &counts, op)
    }

    /// This rank's byte range of a reduce-scatter's full message, after checking the
    /// counts (one per rank) against the buffers' `send` and `recv` lengths in units of
    /// `elem` bytes.
    fn scatter_part(
        &self,
        counts: &[usize],
        send: usize,
        recv: usize,
        elem: usize,
    ) -> Result<std::ops::Range<usize>, Error> {
        if counts.len() != self.size() {
            return Err(Error::Counts {
                size: self.size(),
                counts: counts.len(),
            });
        }
        let before: usize = counts[..self.rank()].iter().sum();
        let (total, mine) = (counts.iter().sum::<usize>(), counts[self.rank()]);
        if send != total * elem || recv != mine * elem {
            return Err(Error::ScatterBuffers {
                total,
                mine,
                send: send / elem,
                recv: recv / elem,
            });
        }
        Ok(before * elem..(before + mine) * elem)
    }
}

#[cfg(test)]
mod tests {
    use std::thread;

    use innet_common::proto::Op;

    use super::super::typed::tests::one_node;
    use crate::{Communicator, Error, Loc};

    /// Runs `f` on every rank of a one-node communicator of `size`, in threads.
    fn each_rank<R: Send + 'static>(
        job: u64,
        size: usize,
        f: impl Fn(&mut Communicator) -> R + Send + Copy + 'static,
    ) -> Vec<R> {
        let ranks: Vec<_> = (0..size)
            .map(|rank| thread::spawn(move || f(&mut one_node(job, rank, size))))
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn allgather_puts_every_block_at_its_rank() {
        let job = u64::from(std::process::id()) << 20 | 0xe0;
        let got = each_rank(job, 3, |c| {
            let r = c.rank() as i32;
            // Negative numbers: every bit pattern survives the OR of zeros.
            let mine = [-r - 1, i32::MIN + r];
            let mut all = [7i32; 6];
            c.allgather(&mine, &mut all).unwrap();
            let mut locs = [Loc::default(); 3];
            c.allgather(&[Loc::new(f64::from(r) / 3.0, r)], &mut locs)
                .unwrap();
            (all, locs)
        });
        for (all, locs) in got {
            assert_eq!(all, [-1, i32::MIN, -2, i32::MIN + 1, -3, i32::MIN + 2]);
            let want: Vec<_> = (0..3).map(|r| Loc::new(f64::from(r) / 3.0, r)).collect();
            assert_eq!(locs.to_vec(), want);
        }
    }

    #[test]
    fn reduce_scatter_keeps_each_ranks_part() {
        let job = u64::from(std::process::id()) << 20 | 0xe1;
        let got = each_rank(job, 3, |c| {
            let r = c.rank() as u64;
            // Element i of rank r holds 10·i + r: the sum over ranks is 30·i + 3.
            let send: Vec<u64> = (0..6).map(|i| 10 * i + r).collect();
            let mut block = [0u64; 2];
            c.reduce_scatter_block(&send, &mut block, Op::Sum).unwrap();
            // Counts 1, 0, 5: rank 1 gets nothing.
            let counts = [1, 0, 5];
            let mut part = vec![0u64; counts[c.rank()]];
            c.reduce_scatter(&send, &mut part, &counts, Op::Max)
                .unwrap();
            (c.rank(), block, part)
        });
        for (rank, block, part) in got {
            let i = 2 * rank as u64;
            assert_eq!(block, [30 * i + 3, 30 * (i + 1) + 3]);
            let max = |i: u64| 10 * i + 2;
            let want: Vec<u64> = match rank {
                0 => vec![max(0)],
                1 => vec![],
                _ => (1..6).map(max).collect(),
            };
            assert_eq!(part, want);
        }
    }

    #[test]
    fn misfit_buffers_and_counts_are_named() {
        let job = u64::from(std::process::id()) << 20 | 0xe2;
        let mut c = one_node(job, 0, 1);
        let mut recv = [9u8; 3];
        let e = c.allgather(&[1u8, 2], &mut recv).unwrap_err();
        assert!(
            matches!(
                e,
                Error::GatherBuffer {
                    block: 2,
                    size: 1,
                    recv: 3
                }
            ),
            "{e}"
        );
        assert_eq!(recv, [9; 3], "a rejected call leaves recv alone");
        let e = c
            .reduce_scatter(&[1i32, 2], &mut [0; 2], &[2, 0], Op::Sum)
            .unwrap_err();
        assert!(matches!(e, Error::Counts { size: 1, counts: 2 }), "{e}");
        let e = c
            .reduce_scatter(&[1i32, 2], &mut [0; 1], &[2], Op::Sum)
            .unwrap_err();
        assert!(e.to_string().contains("receive buffer of 2"), "{e}");
        let e = c
            .reduce_scatter_block(&[1i32], &mut [0], Op::Minloc)
            .unwrap_err();
        assert!(matches!(e, Error::LocElements { .. }), "{e}");
    }
}
