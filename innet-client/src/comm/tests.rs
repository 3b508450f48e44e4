use std::{net::Ipv4Addr, time::Duration};

use super::*;
use innet_common::reduce::ReduceError;

use crate::roles::{Layout, LayoutError};

fn single_node(rank: usize, size: usize, job: u64) -> Config {
    let layout = Layout::new(size, size, 1).unwrap();
    let mut c = Config::new(
        job,
        rank,
        layout,
        vec![NodePlacement::new(0, vec![Ipv4Addr::LOCALHOST])],
    );
    c.timeout = Duration::from_secs(5);
    c
}

#[test]
fn one_node_reduces_locally_for_every_op() {
    let job = u64::from(std::process::id()) << 20 | 0xc0;
    let size = 4;
    let handles: Vec<_> = (0..size)
        .map(|rank| {
            std::thread::spawn(move || {
                let mut c = Core::new(single_node(rank, size, job)).unwrap();
                let mut out = vec![];
                for op in Op::ALL {
                    let dtype = Dtype::I32;
                    let send: Vec<u8> = (0..10i32)
                        .flat_map(|i| {
                            let v = (i + 1) * (rank as i32 + 1) - 3;
                            let mut e = v.to_ne_bytes().to_vec();
                            if op.carries_location() {
                                e.extend_from_slice(&(rank as i32).to_ne_bytes());
                            }
                            e
                        })
                        .collect();
                    let mut recv = vec![0u8; send.len()];
                    let r = c.allreduce_bytes(&send, &mut recv, op, dtype).unwrap();
                    assert_eq!(r.path, Path::Local);
                    out.push((send, recv));
                }
                out
            })
        })
        .collect();
    let all: Vec<Vec<(Vec<u8>, Vec<u8>)>> =
        handles.into_iter().map(|h| h.join().unwrap()).collect();
    for (k, op) in Op::ALL.into_iter().enumerate() {
        let mut parts: Vec<Vec<u8>> = all.iter().map(|r| r[k].0.clone()).collect();
        for p in &mut parts {
            swap_order(op, Dtype::I32, p);
        }
        let mut expected = innet_common::reduce::reduce_all(op, Dtype::I32, &parts).unwrap();
        swap_order(op, Dtype::I32, &mut expected);
        for r in &all {
            assert_eq!(r[k].1, expected, "{op:?}");
        }
    }
}

#[test]
fn a_failed_collective_leaves_the_callers_data_in_recv() {
    let job = u64::from(std::process::id()) << 20 | 0xc2;
    let (joined, done) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
    std::thread::scope(|s| {
        // Rank 1 joins but never calls: the leader's collective times out.
        s.spawn(|| {
            let _c = Core::new(single_node(1, 2, job)).unwrap();
            joined.wait();
            done.wait();
        });
        let mut cfg = single_node(0, 2, job);
        cfg.timeout = Duration::from_millis(200);
        let mut c = Core::new(cfg).unwrap();
        joined.wait();
        let send: Vec<u8> = (1..=4i32).flat_map(i32::to_ne_bytes).collect();
        let mut recv = send.clone();
        let e = c.allreduce_bytes(&send, &mut recv, Op::Sum, Dtype::I32);
        assert!(matches!(e, Err(Error::Timeout { .. })), "{e:?}");
        assert_eq!(recv, send);
        done.wait();
    });
}

#[test]
fn bad_calls_are_named() {
    let job = u64::from(std::process::id()) << 20 | 0xc1;
    let mut c = Core::new(single_node(0, 1, job)).unwrap();
    assert!(matches!(
        c.allreduce_bytes(&[0; 8], &mut [0; 4], Op::Sum, Dtype::I32),
        Err(Error::Buffers { send: 8, recv: 4 })
    ));
    assert!(matches!(
        c.allreduce_bytes(&[0; 6], &mut [0; 6], Op::Sum, Dtype::I32),
        Err(Error::Partial { .. })
    ));
    assert!(matches!(
        c.allreduce_bytes(&[0; 8], &mut [0; 8], Op::Band, Dtype::F64),
        Err(Error::Reduce(ReduceError::Undefined(Op::Band, Dtype::F64)))
    ));
    let mut cfg = single_node(3, 2, job);
    cfg.rank = 3;
    assert!(matches!(
        Core::new(cfg),
        Err(Error::Layout(LayoutError::RankOutOfRange {
            rank: 3,
            size: 2
        }))
    ));
}
