//! The collectives the interposer intercepts and why one goes to MPI: `#[repr(C)]` enums
//! whose values the shim uses as they are (the generated header's `INNET_KIND_*` and
//! `INNET_PASS_*`, see `header`).

use std::ffi::c_int;

/// A collective the interposer intercepts, under its MPI name.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Allreduce = 0,
    Reduce = 1,
    Bcast = 2,
    Barrier = 3,
    Iallreduce = 4,
    Ireduce = 5,
    Ibcast = 6,
    Ibarrier = 7,
    Allgather = 8,
    ReduceScatterBlock = 9,
    ReduceScatter = 10,
}

/// Why a collective went to MPI.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pass {
    /// innet is off for the job or for this kind.
    Disabled = 0,
    /// An op innet does not reduce (user-defined, `MPI_REPLACE` …).
    Op = 1,
    /// A datatype innet does not lay out.
    Datatype = 2,
    /// innet does not serve the communicator (see the report's `not_served`).
    Communicator = 3,
    Intercommunicator = 4,
    /// Nothing to reduce.
    Empty = 5,
    /// MPI is faster for the size (the cutover table or the learned decision).
    Cutover = 6,
    /// innet failed an earlier call on the communicator.
    Error = 7,
    /// MPI's turn in a trial of the learned cutover.
    Learning = 8,
}

impl Kind {
    pub const ALL: [Self; 11] = [
        Self::Allreduce,
        Self::Reduce,
        Self::Bcast,
        Self::Barrier,
        Self::Iallreduce,
        Self::Ireduce,
        Self::Ibcast,
        Self::Ibarrier,
        Self::Allgather,
        Self::ReduceScatterBlock,
        Self::ReduceScatter,
    ];

    /// The MPI name in lower case without `MPI_` (the report's key).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Allreduce => "allreduce",
            Self::Reduce => "reduce",
            Self::Bcast => "bcast",
            Self::Barrier => "barrier",
            Self::Iallreduce => "iallreduce",
            Self::Ireduce => "ireduce",
            Self::Ibcast => "ibcast",
            Self::Ibarrier => "ibarrier",
            Self::Allgather => "allgather",
            Self::ReduceScatterBlock => "reduce_scatter_block",
            Self::ReduceScatter => "reduce_scatter",
        }
    }

    /// The kind of the shim's code (`None`: not one).
    #[must_use]
    pub fn from_c(code: c_int) -> Option<Self> {
        usize::try_from(code)
            .ok()
            .and_then(|i| Self::ALL.get(i).copied())
    }

    /// The blocking kind a non-blocking one falls back to before it has learned its own
    /// way (`Iallreduce` → `Allreduce` …); a blocking kind itself.
    #[must_use]
    pub const fn blocking(self) -> Self {
        match self {
            Self::Iallreduce => Self::Allreduce,
            Self::Ireduce => Self::Reduce,
            Self::Ibcast => Self::Bcast,
            Self::Ibarrier => Self::Barrier,
            k => k,
        }
    }

    /// The non-blocking kinds: started, completed later (their time runs from start to the
    /// completion the application sees).
    pub const STARTED: [Self; 4] = [
        Self::Iallreduce,
        Self::Ireduce,
        Self::Ibcast,
        Self::Ibarrier,
    ];

    /// One of [`Self::STARTED`].
    #[must_use]
    pub fn is_started(self) -> bool {
        Self::STARTED.contains(&self)
    }

    /// The index of the kind in [`Self::ALL`] (the learner's and the counters').
    #[must_use]
    pub const fn index(self) -> usize {
        self as usize
    }
}

impl Pass {
    pub const ALL: [Self; 9] = [
        Self::Disabled,
        Self::Op,
        Self::Datatype,
        Self::Communicator,
        Self::Intercommunicator,
        Self::Empty,
        Self::Cutover,
        Self::Error,
        Self::Learning,
    ];

    /// The reason as the report names it (`allreduce/cutover` …).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Disabled => "disabled",
            Self::Op => "op",
            Self::Datatype => "datatype",
            Self::Communicator => "communicator",
            Self::Intercommunicator => "intercommunicator",
            Self::Empty => "empty",
            Self::Cutover => "cutover",
            Self::Error => "error",
            Self::Learning => "learning",
        }
    }

    /// The reason of the shim's code (`None`: not one).
    #[must_use]
    pub fn from_c(code: c_int) -> Option<Self> {
        usize::try_from(code)
            .ok()
            .and_then(|i| Self::ALL.get(i).copied())
    }
}

/// Every kind's name, in [`Kind::ALL`]'s order (the learner's kinds).
pub const NAMES: [&str; Kind::ALL.len()] = {
    let mut names = [""; Kind::ALL.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = Kind::ALL[i].name();
        i += 1;
    }
    names
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_positions_and_round_trip() {
        for (i, k) in Kind::ALL.iter().enumerate() {
            assert_eq!(k.index(), i);
            assert_eq!(Kind::from_c(i as c_int), Some(*k));
            assert_eq!(NAMES[i], k.name());
        }
        for (i, p) in Pass::ALL.iter().enumerate() {
            assert_eq!(*p as usize, i);
            assert_eq!(Pass::from_c(i as c_int), Some(*p));
        }
        assert_eq!(Kind::from_c(-1), None);
        assert_eq!(Kind::from_c(11), None);
    }

    #[test]
    fn nonblocking_kinds_fall_back_to_their_blocking_kinds() {
        let started: Vec<_> = Kind::ALL.into_iter().filter(|k| k.is_started()).collect();
        assert_eq!(
            started,
            [
                Kind::Iallreduce,
                Kind::Ireduce,
                Kind::Ibcast,
                Kind::Ibarrier
            ]
        );
        for k in started {
            assert_eq!(format!("i{}", k.blocking().name()), k.name());
        }
        assert_eq!(Kind::Allgather.blocking(), Kind::Allgather);
    }
}
