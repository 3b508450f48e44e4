//! Every map of the object, defined with BTF (`.maps`) so libbpf-based tools load the object
//! and `bpftool map dump` prints field names.

use aya_ebpf::{bindings::BPF_NOEXIST, btf_maps::PerCpuHashMap, macros::btf_map};
use innet_common::{maps::MAX_PORTS, stats::PortStats};

/// Counters per ingress ifindex. Written by every CPU, each into its own per-CPU copy;
/// read (summed) by `innet stats`. Entries appear on a port's first packet.
#[btf_map]
static PORT_STATS: PerCpuHashMap<u32, PortStats, { MAX_PORTS as usize }> = PerCpuHashMap::new();

/// This CPU's counters of port `ifindex`, created zeroed on first use. `None` only when the
/// map is full (more ports than `MAX_PORTS`): the packet is then handled but not counted.
#[inline(always)]
pub fn port_stats(ifindex: u32) -> Option<*mut PortStats> {
    if let Some(p) = PORT_STATS.get_ptr_mut(ifindex) {
        return Some(p);
    }
    // Another CPU may insert concurrently: NOEXIST makes that harmless, lookup again.
    let _ = PORT_STATS.insert(ifindex, PortStats::default(), u64::from(BPF_NOEXIST));
    PORT_STATS.get_ptr_mut(ifindex)
}
