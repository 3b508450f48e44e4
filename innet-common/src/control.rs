//! Control packets (query, notify, kill) go from the XDP program to the switch daemon
//! through a ring buffer, while a daemon runs (`SwitchConfig::control_to_daemon`); without
//! one they pass on like any other frame.

/// Largest control frame handed up: Ethernet + IPv4 with options + UDP + BTH + DETH + INC +
/// control payload + pad + ICRC (238 B without IPv4 options), rounded up.
pub const CONTROL_FRAME_MAX: usize = 256;
/// Ring buffer size: bounds the queue of control packets waiting for the daemon; when it
/// is full, further control packets are dropped and counted (`control_dropped`).
pub const CONTROL_RING_BYTES: usize = 256 * 1024;
/// Control frames a port may hand up per CPU in each [`CONTROL_WINDOW_NS`] through the
/// ring the daemon reads first (`CONTROL_EVENTS`); past that share, its frames go to the
/// overflow ring (`CONTROL_OVERFLOW`, same size), which wakes nobody and which the daemon
/// reads every few ms and only when the first is empty (`control_over_share`). A host's
/// set-up sends a handful (a query per communicator, a notify, a kill): it never waits
/// behind another port's flood, and a flood wakes the daemon at most this often.
pub const CONTROL_FRAMES_PER_WINDOW: u64 = 8;
/// The window of [`CONTROL_FRAMES_PER_WINDOW`].
pub const CONTROL_WINDOW_NS: u64 = 10_000_000;

/// One control frame as the daemon receives it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControlEvent {
    /// Port the frame arrived on.
    pub ifindex: u32,
    /// Bytes of `frame` that are valid.
    pub len: u32,
    pub frame: [u8; CONTROL_FRAME_MAX],
}

/// Switch-wide settings written by the daemon (`SWITCH_CONFIG[0]`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SwitchConfig {
    /// 1 while a daemon consumes control packets; 0 lets them pass on untouched.
    pub control_to_daemon: u32,
    /// DPU: the port towards the host (its PF's representor), whose INC data is the host's
    /// own contribution and whose [`crate::proto::MASTER_DPU_SETUP`] control packets go to
    /// the daemon. 0 elsewhere.
    pub host_ifindex: u32,
    /// The switch's own address (the daemon's `--ip`, where its children address their
    /// partial results); 0.0.0.0 when unknown. INC data addressed to it for a group this
    /// switch does not hold is answered with a group-lost notice
    /// ([`crate::proto::BTH_FLAG_LOST`]).
    pub own_ip: [u8; 4],
}

/// Map of groups being set up: `LruHashMap<u32 wire id, u64 CLOCK_MONOTONIC ns>`, written by
/// the daemon when it sees a group's query or notify. Data of a group this switch does not
/// hold (yet) that is listed here for less than [`SETTING_UP_NS`] is dropped (counted as
/// `lost_setting_up`) instead of answered with a group-lost notice: the daemons install a
/// new group a few ms apart, and a child's first partial may overtake its parent's install.
pub const SETTING_UP: &str = "SETTING_UP";
/// Entries of [`SETTING_UP`] (least recently used ones go first).
pub const SETTING_UP_ENTRIES: u32 = 1024;
/// How long a group counts as being set up after its last query or notify here.
pub const SETTING_UP_NS: u64 = 2_000_000_000;
/// Group-lost notices a port may draw per CPU in each [`LOST_NOTICE_WINDOW_NS`]; beyond,
/// data for groups the switch does not hold is dropped and counted
/// (`lost_notices_limited`). A member whose group vanished needs one notice (its window's
/// packets draw at most a few); a host scanning wire ids gets no answer past the budget,
/// and the switch sends no flood back.
pub const LOST_NOTICES_PER_WINDOW: u64 = 16;
/// The window of [`LOST_NOTICES_PER_WINDOW`].
pub const LOST_NOTICE_WINDOW_NS: u64 = 10_000_000;
/// The program that answers data of a lost group with a notice (tail call `JUMP_LOST`).
pub const PROG_LOST: &str = "innet_lost";

#[cfg(feature = "user")]
mod pod {
    // SAFETY: repr(C) structs of integers and byte arrays, no implicit padding.
    unsafe impl aya::Pod for super::ControlEvent {}
    unsafe impl aya::Pod for super::SwitchConfig {}
}
