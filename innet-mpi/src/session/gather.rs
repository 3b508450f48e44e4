//! MPI_Allgather and MPI_Reduce_scatter(_block) on a session: the blocks sit in MPI's rank
//! order, which is not innet's (innet numbers ranks node by node), so the session lays
//! them out itself around the communicator's allreduce.

use innet_client::{Error, Report};
use innet_common::proto::{Dtype, Op};

use super::{Session, Shape};

impl Session {
    /// Allgather of `block` bytes per rank into `recv` (`size × block` bytes, rank `i`'s
    /// block at `i × block`), this rank's block taken from `send` (`None`: in place, it is
    /// already at its offset in `recv`). A bitwise OR of messages that are zero but for
    /// their own rank's block.
    ///
    /// # Safety
    /// `send` (if any) valid for `block` bytes, `recv` writable for `size × block` bytes.
    pub unsafe fn allgather(
        &mut self,
        send: Option<*const u8>,
        recv: *mut u8,
        block: usize,
    ) -> Result<Report, Error> {
        // SAFETY: the caller's buffers.
        let out = unsafe { std::slice::from_raw_parts_mut(recv, block * self.size) };
        let own = self.rank * block..(self.rank + 1) * block;
        self.scratch.clear();
        match send {
            Some(s) => self
                .scratch
                .extend_from_slice(unsafe { std::slice::from_raw_parts(s, block) }),
            None => self.scratch.extend_from_slice(&out[own.clone()]),
        }
        out.fill(0);
        out[own].copy_from_slice(&self.scratch);
        // No copy of the input kept: MPI leaves a failed call's buffer undefined.
        self.comm.allreduce_bytes_in_place(out, Op::Bor, Dtype::U8)
    }

    /// Reduce-scatter: `send` (`None`: in place, the input is in `recv`) holds the counts'
    /// sum of elements laid out as `shape` says; `recv` gets this rank's `counts[rank]`
    /// reduced elements, the ranks before it holding the ones before.
    ///
    /// # Safety
    /// `counts` has one count per rank; `send` (or `recv` in place) valid for the counts'
    /// sum of elements `shape.stride` bytes apart, `recv` writable for this rank's count.
    pub unsafe fn reduce_scatter(
        &mut self,
        send: Option<*const u8>,
        recv: *mut u8,
        counts: &[usize],
        shape: Shape,
        op: Op,
        dtype: Dtype,
    ) -> Result<Report, Error> {
        let total: usize = counts.iter().sum();
        let before: usize = counts[..self.rank].iter().sum();
        let mine = counts[self.rank];
        let mut full = std::mem::take(&mut self.full);
        full.clear();
        full.resize(total * shape.stride, 0);
        let input = send.unwrap_or(recv.cast_const());
        let whole = Shape {
            count: total,
            ..shape
        };
        // SAFETY: the caller's input for `total` elements; `full` is ours, as long.
        let report = unsafe { self.allreduce(Some(input), full.as_mut_ptr(), whole, op, dtype) };
        if report.is_ok() && mine > 0 {
            let start = before * shape.stride;
            let bytes = (mine - 1) * shape.stride + shape.used_bytes(op, dtype);
            // SAFETY: this rank's elements of `full` into the caller's `recv` (in place:
            // its start, which the input no longer needs).
            unsafe { std::ptr::copy_nonoverlapping(full[start..].as_ptr(), recv, bytes) };
        }
        self.full = full;
        report
    }
}
