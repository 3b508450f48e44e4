//! The kernel's BPF run-time statistics (`kernel.bpf_stats_enabled`), switched on for a
//! measurement and put back afterwards, also when the process is torn down by a signal
//! (the lab's teardown calls [`restore_now`]).

use std::sync::Mutex;

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// The value of `kernel.bpf_stats_enabled` to put back (`None`: nothing to restore).
static SAVED: Mutex<Option<String>> = Mutex::new(None);

/// The kernel times every BPF program run until the guard drops, then the old setting is
/// back (also on unwinding; [`restore_now`] for a process that exits without it).
#[must_use = "the setting is restored when the guard drops"]
pub struct BpfStats {
    /// Whether the kernel records run times now.
    pub enabled: bool,
}

impl BpfStats {
    /// Turns the kernel's BPF run-time statistics on; `enabled` is false when it cannot
    /// (the XDP figures are then left out, not guessed).
    pub fn enable() -> Self {
        let Ok(old) = std::fs::read_to_string(BPF_STATS) else {
            return Self { enabled: false };
        };
        let old = old.trim().to_owned();
        if old != "0" {
            return Self { enabled: true };
        }
        let enabled = std::fs::write(BPF_STATS, "1").is_ok();
        if enabled {
            *SAVED
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(old);
        }
        Self { enabled }
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        restore_now();
    }
}

/// Puts the old `kernel.bpf_stats_enabled` back, if this process changed it.
pub fn restore_now() {
    let saved = SAVED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    if let Some(v) = saved
        && let Err(e) = std::fs::write(BPF_STATS, &v)
    {
        eprintln!("restoring {BPF_STATS} to {v}: {e}");
    }
}
