//! What can go wrong in a collective, and what the allreduce rejects before it starts.

use innet_common::proto::{Dtype, Op, element_bytes};

use std::io;

use innet_common::reduce::ReduceError;

use crate::{
    bootstrap::BootstrapError, handshake::HandshakeError, nic::TreeError, roles::LayoutError,
};

/// Everything that can go wrong in a collective.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("send buffer has {send} bytes, receive buffer {recv}: they must be the same size")]
    Buffers { send: usize, recv: usize },
    #[error("send buffer has {send} elements, receive buffer {recv}: they must be as long")]
    Lengths { send: usize, recv: usize },
    #[error("{op} takes {want} elements", op = op.name(), want = if op.carries_location() { "Loc<T>" } else { "plain (not Loc<T>)" })]
    LocElements { op: Op },
    #[error("{bytes} bytes is not a whole number of {op}/{dtype} elements ({elem} bytes each)", op = op.name(), dtype = dtype.name())]
    Partial {
        bytes: usize,
        elem: usize,
        op: Op,
        dtype: Dtype,
    },
    #[error("an allgather of {block}-byte blocks over {size} ranks takes a {want}-byte receive buffer, not {recv}", want = block * size)]
    GatherBuffer {
        block: usize,
        size: usize,
        recv: usize,
    },
    #[error("a reduce-scatter over {size} ranks takes one count per rank, not {counts}")]
    Counts { size: usize, counts: usize },
    #[error(
        "a reduce-scatter of counts summing to {total} elements takes a send buffer of {total} and a receive buffer of {mine} (this rank's count), not {send} and {recv}"
    )]
    ScatterBuffers {
        total: usize,
        mine: usize,
        send: usize,
        recv: usize,
    },
    #[error(transparent)]
    Reduce(#[from] ReduceError),
    #[error("timed out waiting for {what}: are all ranks calling the same collectives?")]
    Timeout { what: &'static str },
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("malformed message from the node's leader")]
    BadLocalMessage,
    #[error("inc-nic: {0}")]
    Tree(#[from] TreeError),
    #[error("bootstrap: {0}")]
    Bootstrap(#[from] BootstrapError),
}

/// What the allreduce rejects before it starts: a message of `bytes` that is not a whole
/// number of elements, an op MPI does not define on the type.
pub(super) fn check_message(op: Op, dtype: Dtype, bytes: usize) -> Result<(), Error> {
    let elem = element_bytes(op, dtype);
    if !bytes.is_multiple_of(elem) {
        return Err(Error::Partial {
            bytes,
            elem,
            op,
            dtype,
        });
    }
    if !op.defined_on(dtype) {
        return Err(ReduceError::Undefined(op, dtype).into());
    }
    Ok(())
}
