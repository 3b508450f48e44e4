//! What every rank of a campaign job does: allreduces cycling through a few collectives of
//! different shapes, each checked against the reference and timed against its bound.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use innet_client::{Communicator, Mode};
use innet_common::proto::{Dtype, Op, element_bytes};

use crate::job::{expected, input};

/// The modes whose communicators create groups in the network (churn and soak).
pub const NETWORK_MODES: [Mode; 4] = [Mode::IncNode, Mode::IncSocket, Mode::IncNic, Mode::IncDpu];

/// A call's bound with the client's default 10 s timeout: a call slower than this hangs.
pub const DEFAULT_BOUND: Duration = Duration::from_secs(11);

/// One collective: (op, type, bytes).
pub type Case = (Op, Dtype, usize);

/// A long message: what the campaign's streaming rows reduce under loss.
pub const LONG_MESSAGE: Case = (Op::Sum, Dtype::F64, 16 << 20);

/// The collectives each rank cycles through by default: (op, type, bytes) — one element, a partial
/// packet, a full packet, several packets; integers and floats (whose inputs are exact in
/// any order, so every result is checked bit for bit).
pub const CASES: [Case; 7] = [
    (Op::Sum, Dtype::I32, 4),
    (Op::Max, Dtype::U16, 64),
    (Op::Minloc, Dtype::I32, 256),
    (Op::Bxor, Dtype::U64, 1408),
    (Op::Sum, Dtype::I64, 4000),
    (Op::Sum, Dtype::F64, 8000),
    (Op::Maxloc, Dtype::F32, 512),
];

/// What one rank observed.
#[derive(Default)]
pub struct RankTally {
    pub wrong: usize,
    pub errors: usize,
    pub hangs: usize,
    pub fallbacks: usize,
    /// Fallbacks by the reason the library gave (its `Fallback`, debug-printed).
    pub fallback_reasons: BTreeMap<String, usize>,
    pub retransmissions: u64,
    pub max_call: Duration,
    pub total: Duration,
    pub first_error: Option<String>,
}

/// The expected result of each of `cases` for `size` ranks.
#[must_use]
pub fn answers(size: usize, cases: &[Case]) -> Vec<Vec<u8>> {
    cases
        .iter()
        .enumerate()
        .map(|(c, &(op, dtype, bytes))| {
            expected(size, c, op, dtype, bytes / element_bytes(op, dtype))
        })
        .collect()
}

/// `n` allreduces cycling through `cases`, each checked against `answers` and timed.
pub fn calls(
    comm: &mut Communicator,
    n: usize,
    cases: &[Case],
    answers: &[Vec<u8>],
    bound: Duration,
    mut progressed: impl FnMut(usize, usize),
) -> RankTally {
    let rank = comm.rank();
    let inputs: Vec<Vec<u8>> = cases
        .iter()
        .enumerate()
        .map(|(c, &(op, dtype, bytes))| input(rank, c, op, dtype, bytes / element_bytes(op, dtype)))
        .collect();
    let mut recvs: Vec<Vec<u8>> = inputs.iter().map(|i| vec![0u8; i.len()]).collect();
    let mut t = RankTally::default();
    for i in 0..n {
        let c = i % cases.len();
        let (op, dtype, _) = cases[c];
        let recv = &mut recvs[c];
        let start = Instant::now();
        let result = comm.allreduce_bytes(&inputs[c], recv, op, dtype);
        let took = start.elapsed();
        match result {
            Ok(report) => {
                t.wrong += usize::from(*recv != answers[c]);
                if let Some(why) = report.fallback {
                    t.fallbacks += 1;
                    *t.fallback_reasons.entry(format!("{why:?}")).or_insert(0) += 1;
                }
                t.retransmissions += u64::from(report.retransmissions);
            }
            Err(e) => {
                t.errors += 1;
                t.first_error
                    .get_or_insert_with(|| format!("rank {rank} call {i}: {e}"));
            }
        }
        t.hangs += usize::from(took > bound);
        t.max_call = t.max_call.max(took);
        t.total += took;
        progressed(rank, i);
    }
    t
}
