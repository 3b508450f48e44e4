//! Fault injection for test fabrics (the kernels here have no netem): `innet_fault`, attached
//! to a link's port, drops every n-th INC contribution or result that enters it, and counts
//! what it saw and dropped. Other traffic passes untouched.

use crate::stats::counters;

/// What to drop (`FAULT_CONFIG[0]`); 0 drops nothing.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultConfig {
    /// Every n-th INC data packet without the result bit (a contribution or partial).
    pub drop_contribution_every: u32,
    /// Every n-th INC data packet with the result bit (a result or reply).
    pub drop_result_every: u32,
}

counters! {
    /// What the injector saw and did (`FAULT_STATS[0]`, per CPU: "every n-th" counts per CPU).
    pub struct FaultStats {
        contributions,
        results,
        contributions_dropped,
        results_dropped,
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: repr(C) structs of integers without padding.
    unsafe impl aya::Pod for super::FaultConfig {}
    unsafe impl aya::Pod for super::FaultStats {}
}
