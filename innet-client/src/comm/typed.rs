//! The typed collectives: the byte API's checks and zero-copy views under element types.

use innet_common::proto::Op;

use super::{Core, Error, Report};
use crate::element::Element;

impl Core {
    /// The handle's [`Communicator::allreduce`](crate::Communicator::allreduce), on the core.
    pub fn allreduce<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        op: Op,
    ) -> Result<Report, Error> {
        if send.len() != recv.len() {
            return Err(Error::Lengths {
                send: send.len(),
                recv: recv.len(),
            });
        }
        if op.carries_location() != T::LOC {
            return Err(Error::LocElements { op });
        }
        T::as_bytes(send, recv, |s, r| self.allreduce_bytes(s, r, op, T::DTYPE))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::{net::Ipv4Addr, thread, time::Duration};

    use innet_common::proto::Op;

    use crate::{Communicator, Config, Error, Layout, Loc, NodePlacement, Path};

    /// Rank `rank` of a communicator of `size` ranks on one node (this host).
    pub(in crate::comm) fn one_node(job: u64, rank: usize, size: usize) -> Communicator {
        let layout = Layout::new(size, size, 1).unwrap();
        let node = NodePlacement::new(0, vec![Ipv4Addr::LOCALHOST]);
        let mut cfg = Config::new(job, rank, layout, vec![node]);
        cfg.timeout = Duration::from_secs(5);
        Communicator::new(cfg).unwrap()
    }

    #[test]
    #[expect(clippy::float_cmp, reason = "halves and small integers add up exactly")]
    fn typed_sums_and_locations_come_back_typed() {
        let job = u64::from(std::process::id()) << 20 | 0xd0;
        let size = 3;
        let results: Vec<_> = (0..size)
            .map(|rank| {
                thread::spawn(move || {
                    let mut c = one_node(job, rank, size);
                    let r = rank as f64;
                    let mut sum = [0f64; 2];
                    let report = c.allreduce(&[r, -r / 2.0], &mut sum, Op::Sum).unwrap();
                    assert_eq!(report.path, Path::Local);
                    let mut max = [0u16; 1];
                    c.allreduce(&[u16::MAX - rank as u16], &mut max, Op::Max)
                        .unwrap();
                    let mut low = [Loc::default()];
                    let mine = Loc::new(10 - rank as i64 % 2, rank as i32);
                    c.allreduce(&[mine], &mut low, Op::Minloc).unwrap();
                    (sum, max, low)
                })
            })
            .collect();
        for h in results {
            let (sum, max, low) = h.join().unwrap();
            assert_eq!(sum, [3.0, -1.5]);
            assert_eq!(max, [u16::MAX]);
            // Ranks 0 and 2 hold 10, rank 1 holds 9.
            assert_eq!(low, [Loc::new(9, 1)]);
        }
    }

    #[test]
    #[expect(clippy::float_cmp, reason = "an untouched value")]
    fn typed_misuse_is_named() {
        let job = u64::from(std::process::id()) << 20 | 0xd1;
        let mut c = one_node(job, 0, 1);
        let e = c.allreduce(&[1i32, 2], &mut [0; 3], Op::Sum).unwrap_err();
        assert!(matches!(e, Error::Lengths { send: 2, recv: 3 }), "{e:?}");
        let e = c.allreduce(&[1i32], &mut [0], Op::Minloc).unwrap_err();
        assert!(matches!(e, Error::LocElements { op: Op::Minloc }), "{e}");
        assert!(e.to_string().contains("Loc<T>"), "{e}");
        let e = c
            .allreduce(&[Loc::new(1i32, 0)], &mut [Loc::default()], Op::Sum)
            .unwrap_err();
        assert!(matches!(e, Error::LocElements { op: Op::Sum }), "{e}");
        let mut recv = [0.0f32];
        let e = c.allreduce(&[2.5f32], &mut recv, Op::Band).unwrap_err();
        assert!(matches!(e, Error::Reduce(_)), "{e}");
        assert_eq!(recv, [0.0], "a rejected call leaves recv alone");
    }
}
