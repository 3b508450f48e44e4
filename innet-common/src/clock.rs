//! Userspace's reading of the clock BPF programs stamp with (`bpf_ktime_get_ns` is
//! `CLOCK_MONOTONIC`), so a time a program wrote and one userspace takes compare.

/// `CLOCK_MONOTONIC` in nanoseconds.
#[must_use]
pub fn ktime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    ts.tv_sec.cast_unsigned() * 1_000_000_000 + ts.tv_nsec.cast_unsigned()
}
