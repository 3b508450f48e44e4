//! What every rank of a campaign job does: allreduces cycling through a few collectives of
//! different shapes, each checked against the reference and timed against its bound.

use std::{
    collections::{BTreeMap, VecDeque},
    time::{Duration, Instant},
};

use innet_client::{Communicator, Mode};
use innet_common::proto::{Dtype, Op, element_bytes};

use innet_lab::job::{expected, input};

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

/// The collective a campaign job calls over its cases.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
#[value(rename_all = "kebab-case")]
pub enum Collective {
    /// Every rank gets the reduction of every rank's message.
    #[default]
    Allreduce,
    /// Every rank gets every rank's message, in rank order (the case's bytes per rank).
    Allgather,
    /// Every rank gets its block of the reduction of the case's message, the message
    /// shortened to a whole number of elements per rank.
    ReduceScatterBlock,
    /// Non-blocking allreduces, [`OUTSTANDING`] started before the oldest is waited for.
    Iallreduce,
}

/// Requests a rank of the `iallreduce` rows keeps outstanding.
pub const OUTSTANDING: usize = 3;

impl Collective {
    pub const ALL: [Self; 4] = [
        Self::Allreduce,
        Self::Allgather,
        Self::ReduceScatterBlock,
        Self::Iallreduce,
    ];

    /// As rows name it (MPI's name in lower case, without the prefix).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Allreduce => "allreduce",
            Self::Allgather => "allgather",
            Self::ReduceScatterBlock => "reduce_scatter_block",
            Self::Iallreduce => "iallreduce",
        }
    }

    /// The elements of a case's message of `bytes` this collective gives each rank as
    /// input, for `size` ranks.
    fn count(self, (op, dtype, bytes): Case, size: usize) -> usize {
        let count = bytes / element_bytes(op, dtype);
        match self {
            Self::ReduceScatterBlock => (count / size).max(1) * size,
            Self::Allreduce | Self::Allgather | Self::Iallreduce => count,
        }
    }
}

/// The cases of the allgather and reduce-scatter rows: one element, a partial packet,
/// several packets (gathered: several more), floats, half floats and MINLOC pairs.
pub const BREADTH_CASES: [Case; 6] = [
    (Op::Sum, Dtype::I32, 4),
    (Op::Max, Dtype::U16, 1408),
    (Op::Sum, Dtype::F64, 8000),
    (Op::Minloc, Dtype::F32, 480),
    (Op::Sum, Dtype::F16, 512),
    (Op::Max, Dtype::BF16, 96),
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

/// The expected result of each of `cases` for `size` ranks: the whole reduction (each rank
/// of a reduce-scatter keeps its block of it) or the gathered messages.
#[must_use]
pub fn answers(size: usize, collective: Collective, cases: &[Case]) -> Vec<Vec<u8>> {
    cases
        .iter()
        .enumerate()
        .map(|(c, &case @ (op, dtype, _))| {
            let count = collective.count(case, size);
            match collective {
                Collective::Allgather => (0..size)
                    .flat_map(|r| input(r, c, op, dtype, count))
                    .collect(),
                _ => expected(size, c, op, dtype, count),
            }
        })
        .collect()
}

/// `n` calls of `collective` cycling through `cases`, each checked against `answers` and
/// timed.
pub fn calls(
    comm: &mut Communicator,
    n: usize,
    (collective, cases): (Collective, &[Case]),
    answers: &[Vec<u8>],
    bound: Duration,
    mut progressed: impl FnMut(usize, usize),
) -> RankTally {
    let (rank, size) = (comm.rank(), comm.size());
    let inputs: Vec<Vec<u8>> = cases
        .iter()
        .enumerate()
        .map(|(c, &case @ (op, dtype, _))| input(rank, c, op, dtype, collective.count(case, size)))
        .collect();
    // What this rank must end up with: its block of a reduce-scatter's answer.
    let wants: Vec<&[u8]> = answers
        .iter()
        .map(|a| match collective {
            Collective::ReduceScatterBlock => {
                let block = a.len() / size;
                &a[rank * block..(rank + 1) * block]
            }
            _ => a,
        })
        .collect();
    let mut recvs: Vec<Vec<u8>> = wants.iter().map(|w| vec![0u8; w.len()]).collect();
    let mut t = RankTally::default();
    // Non-blocking calls started and not yet waited for, oldest first.
    let mut started = VecDeque::new();
    for i in 0..n {
        let c = i % cases.len();
        let (op, dtype, _) = cases[c];
        let recv = &mut recvs[c];
        let start = Instant::now();
        let result = match collective {
            Collective::Allreduce => comm.allreduce_bytes(&inputs[c], recv, op, dtype),
            Collective::Allgather => comm.allgather_bytes(&inputs[c], recv),
            Collective::ReduceScatterBlock => {
                let block = recv.len() / element_bytes(op, dtype);
                comm.reduce_scatter_bytes(&inputs[c], recv, &vec![block; size], op, dtype)
            }
            Collective::Iallreduce => {
                match comm.iallreduce_bytes(inputs[c].clone(), op, dtype) {
                    Ok(request) => started.push_back((i, c, start, request)),
                    Err(e) => t.record(Err(e), false, start.elapsed(), bound, (rank, i)),
                }
                // The oldest completes first (MPI's order); the rest stay in flight.
                while started.len() > OUTSTANDING || (i + 1 == n && !started.is_empty()) {
                    let (j, c, start, request) = started.pop_front().expect("not empty");
                    let (got, result) = request.wait();
                    let right = got.as_slice() == wants[c];
                    t.record(result, right, start.elapsed(), bound, (rank, j));
                    progressed(rank, j);
                }
                continue;
            }
        };
        let right = recv.as_slice() == wants[c];
        t.record(result, right, start.elapsed(), bound, (rank, i));
        progressed(rank, i);
    }
    t
}

impl RankTally {
    /// Counts one call of `(rank, call)` that took `took`: its outcome, whether its result
    /// was `right`, and whether it outlasted `bound`.
    fn record(
        &mut self,
        result: Result<innet_client::Report, innet_client::Error>,
        right: bool,
        took: Duration,
        bound: Duration,
        (rank, call): (usize, usize),
    ) {
        match result {
            Ok(report) => {
                self.wrong += usize::from(!right);
                if let Some(why) = report.fallback {
                    self.fallbacks += 1;
                    *self.fallback_reasons.entry(format!("{why:?}")).or_insert(0) += 1;
                }
                self.retransmissions += u64::from(report.retransmissions);
            }
            Err(e) => {
                self.errors += 1;
                self.first_error
                    .get_or_insert_with(|| format!("rank {rank} call {call}: {e}"));
            }
        }
        self.hangs += usize::from(took > bound);
        self.max_call = self.max_call.max(took);
        self.total += took;
    }
}
