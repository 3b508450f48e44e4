//! Every map of the object, defined with BTF (`.maps`) so libbpf-based tools load the object
//! and `bpftool map dump` prints field names. Userspace shrinks the group maps to the
//! switch's capacity at load time.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    btf_maps::{
        Array, DevMapHash, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, ProgramArray, RingBuf,
    },
    macros::btf_map,
};
use innet_common::{
    control::{
        CONTROL_FRAMES_PER_WINDOW, CONTROL_RING_BYTES, CONTROL_WINDOW_NS, LOST_NOTICE_WINDOW_NS,
        LOST_NOTICES_PER_WINDOW, SETTING_UP_ENTRIES, SwitchConfig,
    },
    group::{
        Completion, DEFAULT_WINDOW, GroupConfig, Handoff, JUMP_SIZE, MAX_CAPACITY, MAX_INPUTS,
        Slot, Stash,
    },
    maps::{MAX_HOST_PORTS, MAX_PORTS},
    stats::{DaemonStats, GroupStats, PortStats},
};

/// Counters per ingress ifindex. Written by every CPU, each into its own per-CPU copy;
/// read (summed) by `innet stats`. Entries appear on a port's first packet.
#[btf_map]
static PORT_STATS: PerCpuHashMap<u32, PortStats, { MAX_PORTS as usize }> = PerCpuHashMap::new();

/// Groups installed on this switch, by 24-bit wire group id. Written by userspace only.
#[btf_map]
pub static GROUPS: HashMap<u32, GroupConfig, { MAX_CAPACITY as usize }> = HashMap::new();

/// Aggregation slots, the switch's window per group (`slot_of`); sized at load for
/// `--capacity` and `--window`. Written by every CPU under the slot's spin lock.
#[btf_map]
pub static SLOTS: Array<Slot, { (MAX_CAPACITY * DEFAULT_WINDOW) as usize }> = Array::new();

/// `BPF_F_MMAPABLE`: userspace maps the array's values into its address space.
const MMAPABLE: usize = 1 << 10;

/// Float contributions, `MAX_INPUTS` per slot (`stash_index`): folded in input order once
/// all are in. Written under the slot's spin lock.
#[btf_map]
pub static STASH: Array<Stash, { (MAX_CAPACITY * DEFAULT_WINDOW * MAX_INPUTS) as usize }> =
    Array::new();

/// This CPU's fold in progress (`fold`).
#[btf_map]
pub static FOLD: PerCpuArray<Fold, 1> = PerCpuArray::new();

/// What the fold callback needs, in a per-CPU map rather than on the stack: the verifier
/// would track constants on the stack through every step and never see two steps alike.
#[repr(C)]
pub struct Fold {
    /// The slot whose stash is folded.
    pub(crate) slot: u32,
    /// Elements per input.
    pub(crate) count: u32,
    /// Callbacks per input (`count / elements_per_step`, rounded up).
    pub(crate) blocks: u32,
    /// The inputs present after the first, in fold order.
    pub(crate) rest: [u32; MAX_INPUTS as usize],
    /// The step's block of elements and position in `rest`, advanced by each step
    /// (computing them from the step number takes a division whose result the verifier
    /// cannot bound).
    pub(crate) block: u32,
    pub(crate) position: u32,
    /// The first input present, and how many follow it: kept here and read back, the
    /// verifier sees them as one unknown value, where registers would hold one constant
    /// per input and walk the rest of the fold once for each.
    pub(crate) first: u32,
    pub(crate) present: u32,
}

/// NIC role: results for the host, one entry per slot (same index as `SLOTS`). The host maps
/// this array and polls an entry's stamp; XDP writes the data first, the stamp last.
#[btf_map]
pub static NIC_COMPLETIONS: Array<
    Completion,
    { (MAX_CAPACITY * DEFAULT_WINDOW) as usize },
    MMAPABLE,
> = Array::new();

/// Counters per group index, per CPU.
#[btf_map]
pub static GROUP_STATS: PerCpuArray<GroupStats, { MAX_CAPACITY as usize }> = PerCpuArray::new();

/// The packet's handoff, handed from `innet_switch` through the tail calls (per CPU: a packet is
/// processed start to end on one CPU).
#[btf_map]
pub static HANDOFF: PerCpuArray<Handoff, 1> = PerCpuArray::new();

/// Largest frame innet handles: Ethernet + the largest payload's packet, rounded up to 64.
pub const MAX_FRAME: usize = 8320;
const _: () = assert!(
    MAX_FRAME
        >= 14 + innet_common::proto::PAYLOAD_OVERHEAD + innet_common::proto::MAX_PAYLOAD_BYTES
);
// `parse::helper_len` masks lengths to 14 bits.
const _: () = assert!(MAX_FRAME <= 0x4000);

/// A per-CPU copy of packet bytes. Loops walk this map memory, not the packet: the verifier
/// bounds an index into a map value reliably, while LLVM rewrites packet-pointer checks in
/// loops into forms it cannot follow; and packet copies stay outside the slot's spin lock.
/// Aligned to 8 so the CRC loops read a word per step (`crc::word_at`).
#[repr(C, align(8))]
pub struct Scratch {
    pub bytes: [u8; MAX_FRAME],
}

#[btf_map]
pub static SCRATCH: PerCpuArray<Scratch, 1> = PerCpuArray::new();

/// Groups being set up here (wire id → `bpf_ktime_get_ns` of their last query or notify),
/// written by the daemon: their data is not answered with a group-lost notice before the
/// group is installed (see `innet_common::control::SETTING_UP`).
#[btf_map]
pub static SETTING_UP: LruHashMap<u32, u64, { SETTING_UP_ENTRIES as usize }> = LruHashMap::new();

/// Tail calls: the emit program and one aggregation program per op × type.
#[btf_map]
pub static JUMP: ProgramArray<{ JUMP_SIZE as usize }> = ProgramArray::new();

/// Every attached port, with `innet_egress` as its egress program: the fan-out target.
#[btf_map]
pub static PORTS: DevMapHash<{ MAX_PORTS as usize }> = DevMapHash::new();

/// Control frames for the daemon (`ControlEvent` records; untyped, as libbpf requires of
/// ring buffers) from ports within their share (`draw_control_frame`). Written by every
/// CPU (the kernel serialises reservations), read by the daemon first.
#[btf_map]
pub static CONTROL_EVENTS: RingBuf<(), CONTROL_RING_BYTES> = RingBuf::new();

/// Control frames from ports past their share: read by the daemon only while
/// `CONTROL_EVENTS` is empty.
#[btf_map]
pub static CONTROL_OVERFLOW: RingBuf<(), CONTROL_RING_BYTES> = RingBuf::new();

/// Ports whose driver drops what XDP redirects out of them (no `NDO_XMIT`), by ifindex, and
/// under key 0 how many there are: written by userspace from the kernel's `xdp-features`.
#[btf_map]
pub static TX_BLOCKED: HashMap<u32, u32, { MAX_PORTS as usize + 1 }> = HashMap::new();

/// Whether any port cannot transmit redirected frames (one lookup on the redirect paths
/// while every port can).
#[inline(always)]
pub fn any_tx_blocked() -> bool {
    // SAFETY: userspace-written; read only.
    unsafe { TX_BLOCKED.get(0) }.is_some_and(|&n| n != 0)
}

/// Counts a frame sent out of `ifindex` on its `redirect_errors` when the kernel will drop
/// it there (checked with [`any_tx_blocked`] first).
#[inline(always)]
pub fn count_if_tx_blocked(ifindex: u32) {
    // SAFETY: userspace-written; read only.
    if unsafe { TX_BLOCKED.get(ifindex) }.is_some()
        && let Some(s) = port_stats(ifindex)
    {
        // SAFETY: this CPU's copy.
        unsafe { (*s).redirect_errors += 1 };
    }
}

/// Switch-wide settings, written by the daemon.
#[btf_map]
pub static SWITCH_CONFIG: Array<SwitchConfig, 1> = Array::new();

/// The daemon's counters. Not touched by XDP: declared here so the object carries its BTF
/// and `bpftool map dump` prints the field names. Written by the daemon.
#[btf_map]
pub static DAEMON_STATS: Array<DaemonStats, 1> = Array::new();

/// Whether `ifindex` is a DPU's port towards its host (`SwitchConfig::host_ifindex`).
#[inline(always)]
pub fn is_host_port(ifindex: u32) -> bool {
    SWITCH_CONFIG
        .get(0)
        .is_some_and(|c| c.host_ifindex != 0 && c.host_ifindex == ifindex)
}

/// Addresses the daemon bound to a port (`HOST_PORTS`). Written by the daemon only.
#[btf_map]
static HOST_PORTS: HashMap<u32, u32, { MAX_HOST_PORTS as usize }> = HashMap::new();

/// Whether `src` is bound to a port other than `ingress`. Attack: a host forges a job
/// member's address on frames no group here member-checks (host-to-host frames: a regroup
/// notice, a final result, a NACK), from its own port.
#[inline(always)]
pub fn bound_elsewhere(src: [u8; 4], ingress: u32) -> bool {
    // SAFETY: userspace-written; read only.
    unsafe { HOST_PORTS.get(u32::from_ne_bytes(src)) }.is_some_and(|&port| port != ingress)
}

/// Group-lost notices each port drew in its current window, per CPU (`lost`).
#[btf_map]
static NOTICE_BUDGET: PerCpuHashMap<u32, Budget, { MAX_PORTS as usize }> = PerCpuHashMap::new();

/// Control frames each port handed up in its current window, per CPU (`control`).
#[btf_map]
static CONTROL_BUDGET: PerCpuHashMap<u32, Budget, { MAX_PORTS as usize }> = PerCpuHashMap::new();

/// A port's draws in the window that began at `window_start` (ns).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Budget {
    window_start: u64,
    drawn: u64,
}

/// Whether port `ifindex` may draw one more of `per_window` in this CPU's current window of
/// `window_ns` (and draws it).
#[inline(always)]
fn draw(
    map: &PerCpuHashMap<u32, Budget, { MAX_PORTS as usize }>,
    ifindex: u32,
    now: u64,
    (per_window, window_ns): (u64, u64),
) -> bool {
    let Some(b) = per_port(map, ifindex) else {
        return false;
    };
    // SAFETY: this CPU's copy.
    let b = unsafe { &mut *b };
    if now.wrapping_sub(b.window_start) >= window_ns {
        b.window_start = now;
        b.drawn = 0;
    }
    if b.drawn >= per_window {
        return false;
    }
    b.drawn += 1;
    true
}

/// Whether port `ifindex` may send one more group-lost notice now (and draws it). Attack:
/// a host sending data for every wire id to the switch would map which groups it holds and
/// make it send a flood back; past the budget it learns nothing and gets nothing.
#[inline(always)]
pub fn draw_lost_notice(ifindex: u32, now: u64) -> bool {
    draw(
        &NOTICE_BUDGET,
        ifindex,
        now,
        (LOST_NOTICES_PER_WINDOW, LOST_NOTICE_WINDOW_NS),
    )
}

/// Whether port `ifindex` is within its share of the daemon's first control ring (and
/// draws one frame of it). Attack: one host floods queries, and every other port's set-up
/// waits behind its frames in one ring, or is dropped at the full ring; past its share its
/// frames go to the overflow ring instead (`control::hand_up`).
#[inline(always)]
pub fn draw_control_frame(ifindex: u32, now: u64) -> bool {
    draw(
        &CONTROL_BUDGET,
        ifindex,
        now,
        (CONTROL_FRAMES_PER_WINDOW, CONTROL_WINDOW_NS),
    )
}

/// Which datagram a fragment belongs to (RFC 791: source, destination, protocol, id).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Datagram {
    src: [u8; 4],
    dst: [u8; 4],
    id: [u8; 2],
    proto: u8,
    pad: u8,
}

impl Datagram {
    #[inline(always)]
    pub const fn of(src: [u8; 4], dst: [u8; 4], id: [u8; 2], proto: u8) -> Self {
        Self {
            src,
            dst,
            id,
            proto,
            pad: 0,
        }
    }
}

/// Datagrams whose first fragment a switch port dropped, with when (ns): their later
/// fragments are dropped too (`frag`). The least recently used go first.
#[btf_map]
pub static DROPPED_DATAGRAMS: LruHashMap<Datagram, u64, 4096> = LruHashMap::new();

/// This CPU's counters of port `ifindex`, created zeroed on first use. `None` only when the
/// map is full (more ports than `MAX_PORTS`): the packet is then handled but not counted.
#[inline(always)]
pub fn port_stats(ifindex: u32) -> Option<*mut PortStats> {
    per_port(&PORT_STATS, ifindex)
}

#[inline(always)]
fn per_port<V: Default>(
    map: &PerCpuHashMap<u32, V, { MAX_PORTS as usize }>,
    ifindex: u32,
) -> Option<*mut V> {
    if let Some(p) = map.get_ptr_mut(ifindex) {
        return Some(p);
    }
    // Another CPU may insert concurrently: NOEXIST makes that harmless, lookup again.
    let _ = map.insert(ifindex, V::default(), u64::from(BPF_NOEXIST));
    map.get_ptr_mut(ifindex)
}

/// Bumps one counter of group `index` on this CPU.
#[inline(always)]
pub fn group_count(index: u32, f: impl FnOnce(&mut GroupStats)) {
    if let Some(s) = GROUP_STATS.get_ptr_mut(index) {
        // SAFETY: this CPU's copy; nothing else writes it while we run.
        f(unsafe { &mut *s });
    }
}
