//! What a switch, NIC or DPU offers a group: announced in queries, negotiated by the MRR in
//! the handshake, handed to a host by its NIC or DPU daemon.

use crate::{
    group::DEFAULT_WINDOW,
    proto::{DEFAULT_PAYLOAD_BYTES, Dtype, Op},
};

/// What one aggregation point can reduce, and how much of it per group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Bit `1 << op`.
    pub ops: u16,
    /// Bit `1 << dtype`.
    pub dtypes: u16,
    /// Largest payload per packet.
    pub max_data_size: u16,
    /// Slots per group (`--window`).
    pub window: u16,
}

impl Capabilities {
    /// These capabilities with `window` slots per group (whichever attach sized the maps:
    /// a restarted daemon may find older pins).
    #[must_use]
    pub fn with_window(self, window: u32) -> Self {
        Self {
            window: u16::try_from(window).unwrap_or(u16::MAX),
            ..self
        }
    }
}

impl Default for Capabilities {
    /// Every op MPI defines on every type, packets of a 1500 B MTU (`innet daemon` raises
    /// it to what its ports' MTU carries).
    fn default() -> Self {
        let ops = Op::ALL.iter().fold(0u16, |m, op| m | 1 << *op as u8);
        let dtypes = Dtype::ALL.iter().fold(0u16, |m, d| m | 1 << *d as u8);
        Self {
            ops,
            dtypes,
            max_data_size: DEFAULT_PAYLOAD_BYTES as u16,
            window: DEFAULT_WINDOW as u16,
        }
    }
}
