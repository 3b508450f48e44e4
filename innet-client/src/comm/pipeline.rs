//! A leader's node-local gather overlapped with the network's rounds, for messages longer
//! than a shared-memory slot on a node of several ranks: the ranks' contributions are
//! folded in as their pieces come (in rank order, element by element, as the whole-message
//! gather does), and the network's rounds leave as soon as their bytes are final instead
//! of after the last piece of the last rank.
//!
//! The result leaves once the network (or the hosts) finished: handing it on as its rounds
//! came back was measured slower on the lab's two CPUs (each piece wakes a rank that then
//! competes with the leader's network loop; docs/host-runtime.md). It leaves as the report,
//! then the data, in [`CHUNK`] pieces, piece 0 (the report and the data's head) last.

use std::{os::fd::RawFd, time::Instant};

use innet_common::{
    proto::{Dtype, Op, element_bytes},
    reduce::combine_into,
};

use super::{Error, Report, same_size};
use crate::{
    endpoint::NodeStage,
    local::{CHUNK, Kind, LocalChannel},
};

/// What a leader knows of its node's stage for one collective.
pub(super) struct Pipeline {
    seq: u32,
    id: (Op, Dtype),
    /// The node's other ranks, in rank order.
    ranks: Vec<u32>,
    len: usize,
    /// Bytes of the contribution folded with every rank's part.
    gathered: usize,
    deadline: Instant,
    error: Option<Error>,
}

impl Pipeline {
    pub(super) fn new(
        seq: u32,
        id: (Op, Dtype),
        ranks: Vec<u32>,
        len: usize,
        deadline: Instant,
    ) -> Self {
        Self {
            seq,
            id,
            ranks,
            len,
            gathered: 0,
            deadline,
            error: None,
        }
    }

    /// The stage for one network attempt, over the node's channel.
    pub(super) fn stage<'a>(&'a mut self, local: &'a mut LocalChannel) -> Stage<'a> {
        Stage { pipe: self, local }
    }

    /// Bytes of the result message (report and data).
    fn total(&self) -> usize {
        Report::BYTES + self.len
    }

    /// Folds in what came; the bytes now final. Records an error instead of failing.
    fn gather(&mut self, local: &mut LocalChannel, wire: &mut [u8]) -> usize {
        if self.gathered == self.len || self.error.is_some() {
            return self.gathered;
        }
        if let Err(e) = local.drain() {
            self.error = Some(Error::Io(e));
            return self.gathered;
        }
        let (seq, (op, dtype)) = (self.seq, self.id);
        let mut upto = self.len;
        for &r in &self.ranks {
            match local.received(Kind::Contribution, seq, r) {
                Some((part, total)) => {
                    if let Err(e) = same_size(r as usize, total, self.len) {
                        self.error = Some(e);
                        return self.gathered;
                    }
                    upto = upto.min(part.len());
                }
                None => upto = 0,
            }
        }
        if upto < self.len {
            upto -= upto % element_bytes(op, dtype);
        }
        if upto > self.gathered {
            let range = self.gathered..upto;
            for &r in &self.ranks {
                let (part, _) = local
                    .received(Kind::Contribution, seq, r)
                    .expect("every rank's part was just seen");
                if let Err(e) =
                    combine_into(op, dtype, &mut wire[range.clone()], &part[range.clone()])
                {
                    self.error = Some(e.into());
                    return self.gathered;
                }
            }
            self.gathered = upto;
        }
        if self.gathered == self.len {
            // Every part is whole: take them off the channel.
            for &r in &self.ranks {
                if let Err(e) = local.recv_msg(Kind::Contribution, seq, Some(r), self.deadline) {
                    self.error = Some(Error::Io(e));
                }
            }
        } else if Instant::now() >= self.deadline {
            self.error = Some(Error::Timeout {
                what: "the contributions of this node's ranks",
            });
        }
        self.gathered
    }

    /// Folds in every rank's part, waiting for them (before the hosts reduce).
    ///
    /// # Errors
    /// A rank's part is wrong or late, or the channel failed.
    pub(super) fn gather_all(
        &mut self,
        local: &mut LocalChannel,
        wire: &mut [u8],
    ) -> Result<(), Error> {
        while self.gather(local, wire) < self.len {
            if let Some(e) = self.error.take() {
                return Err(e);
            }
            let left = self.deadline.saturating_duration_since(Instant::now());
            crate::inbox::wait_readable(local.fd(), None, Some(left));
        }
        self.error.take().map_or(Ok(()), Err)
    }

    /// The stage's error, if it gave up.
    pub(super) fn take_error(&mut self) -> Option<Error> {
        self.error.take()
    }

    /// Ends the collective for the node's ranks: the result's pieces, then piece 0 with the
    /// report.
    ///
    /// # Errors
    /// The channel failed.
    pub(super) fn finish(
        &mut self,
        local: &mut LocalChannel,
        report: &Report,
        wire: &[u8],
    ) -> Result<(), Error> {
        let total = self.total();
        let head = (CHUNK - Report::BYTES).min(self.len);
        let mut first = Vec::with_capacity(Report::BYTES + head);
        first.extend_from_slice(&report.encode());
        first.extend_from_slice(&wire[..head]);
        let id = (Kind::Result, self.seq, total);
        for &r in &self.ranks {
            if head < self.len {
                local.send_pieces(r, id, CHUNK, &wire[head..], self.deadline)?;
            }
            local.send_pieces(r, id, 0, &first, self.deadline)?;
        }
        Ok(())
    }
}

/// [`Pipeline`] as the network loop sees it.
pub(super) struct Stage<'a> {
    pipe: &'a mut Pipeline,
    local: &'a mut LocalChannel,
}

impl NodeStage for Stage<'_> {
    fn gather(&mut self, wire: &mut [u8]) -> usize {
        self.pipe.gather(self.local, wire)
    }

    fn fd(&self) -> RawFd {
        self.local.fd()
    }

    fn deadline(&self) -> Instant {
        self.pipe.deadline
    }

    fn failed(&self) -> bool {
        self.pipe.error.is_some()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::comm::Path;

    fn f64s(seed: u64, count: usize) -> Vec<u8> {
        (0..count)
            .flat_map(|i| ((seed * 1000 + i as u64) as f64 / 7.0).to_be_bytes())
            .collect()
    }

    /// Rank 1 sends two pieces, then waits; rank 2 sends all. The leader folds exactly the
    /// bytes both sent (whole elements), then the rest once rank 1 goes on; each rank gets
    /// the report and the same result as a whole-message gather.
    #[test]
    fn parts_fold_in_as_they_come_and_every_rank_gets_the_result() {
        let job = u64::from(std::process::id()) << 16 | 0x71;
        let (op, dtype, count) = (Op::Sum, Dtype::F64, 20_001);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut leader = LocalChannel::bind(job, 0).expect("bind");
        let own = f64s(0, count);
        let parts = [f64s(1, count), f64s(2, count)];
        let mut want = own.clone();
        for p in &parts {
            combine_into(op, dtype, &mut want, p).expect("combine");
        }
        let len = own.len();
        let senders: Vec<_> = parts
            .iter()
            .cloned()
            .zip(1u32..)
            .map(|(part, rank)| {
                let mut ch = LocalChannel::bind(job, rank).expect("bind");
                std::thread::spawn(move || {
                    let cut = if rank == 1 { 2 * CHUNK } else { len };
                    let id = (Kind::Contribution, 7, len);
                    ch.send_pieces(0, id, 0, &part[..cut], deadline)
                        .expect("send");
                    ch
                })
            })
            .collect();
        let mut wire = own.clone();
        let mut pipe = Pipeline::new(7, (op, dtype), vec![1, 2], len, deadline);
        let mut got = 0;
        while got < 2 * CHUNK && Instant::now() < deadline {
            got = pipe.gather(&mut leader, &mut wire);
        }
        assert_eq!(
            got,
            2 * CHUNK,
            "both ranks' first two pieces (whole elements)"
        );
        assert_eq!(wire[..got], want[..got]);
        assert_eq!(wire[got..], own[got..], "nothing folded beyond");
        let mut rest = senders.into_iter().map(|t| t.join().expect("rank"));
        let mut first = rest.next().expect("rank 1");
        let id = (Kind::Contribution, 7, len);
        first
            .send_pieces(0, id, 2 * CHUNK, &parts[0][2 * CHUNK..], deadline)
            .expect("rest");
        pipe.gather_all(&mut leader, &mut wire).expect("gather");
        assert_eq!(wire, want);
        // The ranks read their results while the leader sends them.
        let readers: Vec<_> = std::iter::once(first)
            .chain(rest)
            .map(|mut ch| {
                std::thread::spawn(move || {
                    let got = ch.recv_msg(Kind::Result, 7, Some(0), deadline);
                    got.expect("result").1
                })
            })
            .collect();
        let report = Report {
            path: Path::Local,
            fallback: None,
            retransmissions: 0,
            regrouped: None,
        };
        pipe.finish(&mut leader, &report, &wire).expect("finish");
        for reader in readers {
            let msg = reader.join().expect("reader");
            assert_eq!(msg[..Report::BYTES], report.encode());
            assert_eq!(msg[Report::BYTES..], want[..]);
        }
    }
}
