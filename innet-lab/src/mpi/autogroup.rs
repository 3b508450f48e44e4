//! The scheduler's autogroups, off while MPI runs.
//!
//! With `kernel.sched_autogroup_enabled = 1` every session is a scheduling group of its
//! own with an equal share of the CPUs. In the multi-node launch each node's daemon starts
//! a session (as sshd gives every login one), so on this machine's shared CPUs one node's
//! spinning ranks would starve another node's, which real nodes, each with its own CPUs,
//! never see. [`AutogroupOff`] writes 0 for as long as any run holds it and puts the old
//! value back when the last one drops it (also when it unwinds from a panic).

use std::sync::Mutex;

const SYSCTL: &str = "/proc/sys/kernel/sched_autogroup_enabled";

/// Runs holding the setting, and the value to restore (`None`: the kernel has no
/// autogroups, or they were already off).
static HELD: Mutex<(usize, Option<String>)> = Mutex::new((0, None));

/// Autogroups off until the last guard drops.
#[must_use = "autogroups are restored when the guard drops"]
pub struct AutogroupOff(());

impl AutogroupOff {
    /// # Panics
    /// The setting exists but cannot be written (not root).
    pub fn new() -> Self {
        let mut held = HELD
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if held.0 == 0 {
            held.1 = current().filter(|v| v != "0");
            if held.1.is_some() {
                std::fs::write(SYSCTL, "0").unwrap_or_else(|e| panic!("{SYSCTL}: {e}"));
            }
        }
        held.0 += 1;
        Self(())
    }
}

impl Default for AutogroupOff {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for AutogroupOff {
    fn drop(&mut self) {
        let mut held = HELD
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        held.0 -= 1;
        if held.0 == 0 {
            restore(&mut held.1);
        }
    }
}

/// The setting now (`None`: this kernel has no autogroups).
#[must_use]
pub fn current() -> Option<String> {
    std::fs::read_to_string(SYSCTL)
        .ok()
        .map(|v| v.trim().to_owned())
}

/// Puts the old value back whatever guards are held: for a process about to exit without
/// unwinding (Ctrl-C).
pub fn restore_now() {
    let mut held = HELD
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    restore(&mut held.1);
}

fn restore(saved: &mut Option<String>) {
    if let Some(v) = saved.take()
        && let Err(e) = std::fs::write(SYSCTL, &v)
    {
        eprintln!("restoring {SYSCTL} to {v}: {e}");
    }
}
