//! What a leader's endpoint refused from the network, counted by the attack each check
//! stops; read as a [`Refusals`](crate::Refusals) snapshot.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::Refusals;

/// The endpoint's refusal counters, shared with its progress thread.
#[derive(Default)]
pub struct Counters {
    pub host_frame_spoofed: AtomicU64,
    pub stray_spoofed: AtomicU64,
    pub result_spoofed: AtomicU64,
    pub result_of_other_group: AtomicU64,
    pub regroup_out_of_range: AtomicU64,
    pub final_from_unasked_rank: AtomicU64,
    pub reassembly_key_out_of_range: AtomicU64,
    pub reassembly_memory_full: AtomicU64,
    pub aside_full: AtomicU64,
    pub resend_rate_limited: AtomicU64,
}

/// Counts one refusal.
pub fn count(counter: &AtomicU64) {
    counter.fetch_add(1, Relaxed);
}

impl Counters {
    /// The counts so far; `backlog_full` is the inbox's own count.
    pub fn snapshot_with(&self, backlog_full: u64) -> Refusals {
        let get = |c: &AtomicU64| c.load(Relaxed);
        Refusals {
            host_frame_spoofed: get(&self.host_frame_spoofed),
            stray_spoofed: get(&self.stray_spoofed),
            result_spoofed: get(&self.result_spoofed),
            result_of_other_group: get(&self.result_of_other_group),
            regroup_out_of_range: get(&self.regroup_out_of_range),
            final_from_unasked_rank: get(&self.final_from_unasked_rank),
            reassembly_key_out_of_range: get(&self.reassembly_key_out_of_range),
            reassembly_memory_full: get(&self.reassembly_memory_full),
            backlog_full,
            aside_full: get(&self.aside_full),
            resend_rate_limited: get(&self.resend_rate_limited),
        }
    }

    /// The counts so far, without the inbox's.
    #[cfg(test)]
    pub fn snapshot(&self) -> Refusals {
        self.snapshot_with(0)
    }
}
