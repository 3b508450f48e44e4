//! Types shared by innet's XDP programs (`innet-ebpf`) and its userspace (`innet-client`,
//! `innet-user`).
//!
//! Everything here is `no_std` and layout-stable: the kernel side reads these structs out
//! of packets and maps, userspace writes and reads the very same definitions. The `user`
//! feature adds what only userspace needs: `aya::Pod` impls, frame encoding/decoding and
//! the RoCEv2 ICRC.
#![no_std]

#[cfg(feature = "user")]
extern crate std;

pub mod capabilities;
pub mod control;
pub mod demux;
pub mod fail;
pub mod fault;
pub mod group;
pub mod proto;
pub mod softfloat;
pub mod stats;
pub mod validate;
pub mod wire;

#[cfg(feature = "user")]
pub mod clock;
#[cfg(feature = "user")]
pub mod codec;
#[cfg(feature = "user")]
pub mod icrc;
#[cfg(feature = "user")]
pub mod reduce;

/// Names and sizes of the maps, as the XDP object declares them and userspace finds them.
pub mod maps {
    /// Per-port classifier counters: `PerCpuHashMap<u32 ifindex, PortStats>`.
    pub const PORT_STATS: &str = "PORT_STATS";
    /// Groups installed on this switch: `HashMap<u32 group, GroupConfig>`.
    pub const GROUPS: &str = "GROUPS";
    /// Aggregation slots: `Array<Slot>`, the switch's window per group.
    pub const SLOTS: &str = "SLOTS";
    /// Per-group counters: `PerCpuArray<GroupStats>`.
    pub const GROUP_STATS: &str = "GROUP_STATS";
    /// Tail-call table: emit and aggregation programs.
    pub const JUMP: &str = "JUMP";
    /// Attached ports, the devmap results are broadcast through.
    pub const PORTS: &str = "PORTS";
    /// Control frames for the daemon from ports within their share: `RingBuf` of
    /// `ControlEvent`, read first.
    pub const CONTROL_EVENTS: &str = "CONTROL_EVENTS";
    /// Control frames from ports past their share: `RingBuf` of `ControlEvent`, read when
    /// `CONTROL_EVENTS` is empty.
    pub const CONTROL_OVERFLOW: &str = "CONTROL_OVERFLOW";
    /// The daemon's counters: `Array<DaemonStats, 1>`.
    pub const DAEMON_STATS: &str = "DAEMON_STATS";
    /// Switch-wide settings: `Array<SwitchConfig, 1>`.
    pub const SWITCH_CONFIG: &str = "SWITCH_CONFIG";
    /// Results a NIC hands to its host: `Array<Completion>`, mmap-able, a window per group.
    pub const NIC_COMPLETIONS: &str = "NIC_COMPLETIONS";
    /// Stashed float contributions: `Array<Stash>`, `window * MAX_INPUTS` per group.
    pub const STASH: &str = "STASH";
    /// Ports whose driver drops what XDP redirects out of them (their `xdp-features` lack
    /// `NDO_XMIT`): `HashMap<u32 ifindex, u32>`, and under key 0 how many there are.
    /// Written by userspace (attach, detach, `innet stats`, the daemon every 2 s).
    pub const TX_BLOCKED: &str = "TX_BLOCKED";
    /// Host and lower-switch addresses the daemon bound to the port they first sent a
    /// control packet on: `HashMap<u32 address (network order as read), u32 ifindex>`.
    /// Written by the daemon only. INC data of no group held here (host-to-host frames
    /// among them) from a bound address on another port is dropped (`spoofed_source`).
    pub const HOST_PORTS: &str = "HOST_PORTS";
    /// Entries of [`HOST_PORTS`]: as many addresses as a daemon binds.
    pub const MAX_HOST_PORTS: u32 = 1 << 16;
    /// How many ports one switch host may attach innet to (entries of `PORT_STATS`).
    pub const MAX_PORTS: u32 = 256;
    /// The XDP entry program of the switch role.
    pub const PROG_SWITCH: &str = "innet_switch";
    /// The XDP entry program of the NIC role (host or SmartNIC port).
    pub const PROG_NIC: &str = "innet_nic";
    /// The program a host posts its own contribution through: attached to the NIC's post
    /// port, a veth whose peer only the host's namespace writes into.
    pub const PROG_NIC_POST: &str = "innet_nic_post";
    /// The fault injector of test fabrics (tc ingress of wire ports).
    pub const PROG_FAULT: &str = "innet_fault";
    /// Its settings and counters per wire port: `HashMap<u32 ifindex, FaultConfig>`,
    /// `PerCpuHashMap<u32 ifindex, FaultStats>`.
    pub const FAULT_CONFIG: &str = "FAULT_CONFIG";
    pub const FAULT_STATS: &str = "FAULT_STATS";
    /// Frames it holds back: `RingBuf` of `DelayedFrame`.
    pub const FAULT_DELAYED: &str = "FAULT_DELAYED";
    /// An empty XDP program returning `XDP_PASS`: the benchmarks' per-packet baseline.
    pub const PROG_PASS: &str = "innet_pass";
    /// The emit program (tail call target).
    pub const PROG_EMIT: &str = "innet_emit";
    /// The devmap egress program that rewrites each broadcast copy.
    pub const PROG_EGRESS: &str = "innet_egress";
    /// The tc ingress program of every switch port that sends each child its copy of a
    /// result spanning several XDP buffers (a devmap broadcast refuses those).
    pub const PROG_FANOUT: &str = "innet_fanout";
    /// The aggregation program (tail call target): takes a contribution into its slot.
    pub const PROG_AGG: &str = "innet_agg";
    /// Prefix of the fold programs, `fold_<op>_<type>`: one per op × type, each folds a
    /// complete round's inputs.
    pub const PROG_FOLD_PREFIX: &str = "fold_";
}
