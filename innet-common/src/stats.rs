//! Counters of the XDP programs, one `PortStats` per ingress port and CPU
//! (`PerCpuHashMap<u32 ifindex, PortStats>`): each CPU writes only its own copy, so the hot
//! path needs no atomics; userspace sums the CPUs.
//!
//! Invariants (per port, summed over CPUs):
//! `rx_packets = non_roce + roce_other + inc_data + inc_control + malformed`,
//! `malformed = Σ mal_*`, and `rx_packets = xdp_pass + xdp_drop + xdp_tx + xdp_redirect + xdp_aborted`.

use crate::validate::Malformed;

/// Declares a counter struct (all `u64`, so no padding) together with its field names and
/// doc comments, so the kernel, `innet stats`, `--json` and `--prometheus` can never
/// disagree on the list.
macro_rules! counters {
    ($(#[$meta:meta])* pub struct $name:ident { $($(#[doc = $doc:literal])* $field:ident,)* }) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name { $($(#[doc = $doc])* pub $field: u64,)* }

        impl $name {
            /// Field names in declaration order.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($field)),*];

            /// Each field's doc comment (its lines joined), in declaration order: what
            /// `--prometheus` prints as HELP.
            pub const HELP: &'static [&'static str] = &[$(concat!($($doc),*)),*];

            /// Every counter with its name, in declaration order.
            #[must_use]
            pub fn fields(&self) -> [(&'static str, u64); { [$(stringify!($field)),*].len() }] {
                [$((stringify!($field), self.$field)),*]
            }

            /// Adds every counter of `other` (summing CPUs or ports).
            pub fn accumulate(&mut self, other: &Self) {
                $(self.$field = self.$field.wrapping_add(other.$field);)*
            }

            /// What was counted since `earlier` (a snapshot of the same counters).
            #[must_use]
            pub fn since(&self, earlier: &Self) -> Self {
                Self { $($field: self.$field.wrapping_sub(earlier.$field),)* }
            }
        }
    };
}

pub(crate) use counters;

counters! {
    /// Per-port counters of the classifier (`bpftool map dump` prints these field names).
    pub struct PortStats {
        /// Every frame the program saw.
        rx_packets,
        /// Bytes of every frame the program saw (all buffers of a multi-buffer frame).
        rx_bytes,
        /// Not IPv4/UDP to port 4791 (ARP, IPv6, TCP, ICMP, fragments, short frames …).
        non_roce,
        /// RoCEv2 (UDP 4791) but not INC: other opcodes, no INC tag.
        roce_other,
        /// Valid INC data packets.
        inc_data,
        /// Valid INC control packets (query, notify, kill).
        inc_control,
        /// Valid INC data of a group this switch does not hold: passed on untouched.
        inc_unknown_group,
        /// Control frames handed to the daemon (consumed here, re-sent by the daemon).
        control_up,
        /// Control frames dropped because the daemon's queue was full.
        control_dropped,
        /// Later fragments of a datagram whose first fragment was dropped here
        /// (`mal_fragment`) within the last second: dropped too, so that a member's kernel
        /// does not queue them for reassembly (counted in `non_roce`, which they are).
        later_fragments_dropped,
        /// Control frames past their port's share (`CONTROL_FRAMES_PER_WINDOW`), queued
        /// where the daemon reads only after every port within its share (handed up, or
        /// dropped as `control_dropped` when that queue is full): a port flooding the
        /// control plane, which other ports' set-ups do not wait behind.
        control_over_share,
        /// INC-tagged frames (and fragments of UDP 4791) rejected and dropped; the `mal_*`
        /// reason counters add up to this.
        malformed,
        /// Rejected: the frame ends inside the INC header, payload or ICRC.
        mal_truncated,
        /// Rejected: IPv4/UDP lengths disagree with each other or with the frame.
        mal_bad_length,
        /// Rejected: `tag_high` is not "MPIr".
        mal_bad_tag,
        /// Rejected: unknown `data_flag`, or `data_flag` and `comm_id` disagree.
        mal_bad_kind,
        /// Rejected: unknown `op_code`.
        mal_bad_op,
        /// Rejected: unknown `oper_and_type`.
        mal_bad_type,
        /// Rejected: `pkt_para_num` × element size differs from the payload (or is zero).
        mal_bad_count,
        /// Rejected: payload longer than the largest innet handles.
        mal_too_large,
        /// Rejected: a control packet whose payload is not one control body.
        mal_bad_control,
        /// Rejected: the first fragment of a datagram to UDP 4791 (or a first UDP fragment
        /// too short to show its ports); RoCEv2 never fragments.
        mal_fragment,
        /// Rejected: an INC packet behind a VLAN tag or after IPv4 options, which the data
        /// path cannot member-check; its sender must send plain untagged IPv4.
        mal_layout,
        /// Rejected: an INC packet addressed to the hand-off MAC that only a switch port's
        /// own emit program writes (02:69:6e:63:fa:xx); no host may send to it.
        mal_handoff,
        /// Verdict XDP_PASS: the frame went on to the kernel (the bridge) untouched.
        xdp_pass,
        /// Verdict XDP_DROP: consumed here (aggregated, or dropped and counted elsewhere).
        xdp_drop,
        /// Verdict XDP_TX: sent back out of the port it came in on.
        xdp_tx,
        /// Verdict XDP_REDIRECT: sent out of another port (or several, a broadcast).
        xdp_redirect,
        /// Verdict XDP_ABORTED: an internal error (a map lookup that cannot fail did).
        xdp_aborted,
        /// Frames innet sent out of this port (results, copies, partials, replies) that the
        /// kernel drops because the port cannot transmit redirected frames (no NDO_XMIT: a
        /// veth whose peer has no NAPI); innet stats names the fix. Counted on the port a
        /// frame leaves by, so outside the per-port invariants.
        redirect_errors,
        /// INC data addressed to this switch for a group it does not hold, answered with a
        /// group-lost notice to its sender (also counted in `inc_unknown_group`).
        lost_notices,
        /// INC data addressed to this switch for a group it does not hold yet but whose
        /// query or notify it saw lately (being set up): dropped without a notice (also
        /// counted in `inc_unknown_group`).
        lost_setting_up,
        /// INC data addressed to this switch for a group it does not hold, past the port's
        /// budget of group-lost notices (`LOST_NOTICES_PER_WINDOW`): dropped without a
        /// notice (also counted in `inc_unknown_group`). A host that draws many scans wire
        /// ids or floods the switch.
        lost_notices_limited,
        /// INC data of no group held here (host-to-host frames among them) whose source
        /// address the daemon bound to another port: dropped. A host that sends these
        /// spoofs a job member's address (or the member moved ports: it binds again once
        /// its old binding expires).
        spoofed_source,
    }
}

counters! {
    /// Per-group counters of the data plane (`GROUP_STATS`, per CPU, indexed by group index).
    pub struct GroupStats {
        /// Data packets of the group that reached this switch.
        rx,
        /// Contributions added into a slot.
        aggregated,
        /// Rounds whose last contribution arrived here.
        completed,
        /// Partial results sent to the parent (first sends and resends).
        sent_up,
        /// Final results received from the parent.
        results_down,
        /// Result copies sent to children (one per child and round, plus re-broadcasts).
        sent_down,
        /// Retransmitted contributions answered with the saved result.
        replies,
        /// Contributions seen twice (never added twice).
        duplicates,
        /// Packets of a round (whole 24-bit PSN) older than the slot's: dropped.
        stale,
        /// Op, type or count differing from the round's first packet, or a PSN whose low
        /// byte is not the packet's `req_id`: dropped.
        mismatch,
        /// From an address that is not a member (nor the parent): dropped.
        not_member,
        /// Op × type this switch cannot aggregate (bitwise and logical ops on floats): dropped.
        unsupported,
        /// A newer round took a slot whose round had not completed (or the round's fold
        /// failed and it left the slot).
        evicted,
        /// NIC role: contributions the host posted (first posts and re-posts).
        posted,
        /// NIC role: results written into `NIC_COMPLETIONS` for the host.
        completions,
        /// Group-lost notices from the parent passed down to the children.
        lost_down,
        /// Group-lost notice copies sent to children (one per child port).
        lost_sent_down,
        /// Copies of a multi-buffer result (jumbo links) that the tc fan-out could not send
        /// to a child (its header template missing, or the kernel refused the clone).
        fanout_errors,
        /// Packets of a newer round that came while the slot's payload copies or fold were
        /// in flight (a few microseconds): dropped; the sender's retransmission lands.
        busy,
        /// Payloads the aggregation could not read from the packet: dropped.
        unreadable,
    }
}

const _: () = assert!(core::mem::size_of::<GroupStats>() == GroupStats::NAMES.len() * 8);

counters! {
    /// Counters of the switch daemon (`DAEMON_STATS[0]`, written by the daemon only).
    pub struct DaemonStats {
        /// Control frames the daemon processed.
        control_handled,
        /// Control frames it could not parse (dropped).
        control_unparsable,
        /// Groups installed from notify.
        groups_installed,
        /// Groups freed by their MRR's kill.
        groups_killed,
        /// Groups collected after the idle timeout.
        groups_collected,
        /// Notify or kill from a host that is not the group's MRR: ignored.
        refused_not_mrr,
        /// Control packet from an address bound to another port (a host's or TOR's first
        /// control packet binds it), or from a switch on a port it cannot come from.
        refused_wrong_port,
        /// Notify refused because a member's address came in on two ports during set-up
        /// (`fail_cause` 9).
        refused_port_conflict,
        /// Notify refused because the switch was full (`fail_cause` 1).
        refused_capacity,
        /// Notify refused because the group's spec is invalid here (`fail_cause` 8).
        refused_invalid,
        /// Queried groups never notified, forgotten (oldest first) to bound the daemon's
        /// memory under a flood of queries.
        queries_forgotten,
        /// TOR probes answered (a host learning which TOR it hangs off).
        probes_answered,
        /// TOR probes that reached a SPINE or came down an uplink: consumed unanswered
        /// (only a host's own TOR answers).
        probes_dropped,
        /// Climbs this switch, the top of the fabric, sent back down to their MRR.
        climbs_returned,
        /// Queries and climbs dropped because their path already held every hop it can
        /// (a fabric deeper than `MAX_LEVELS`).
        paths_full,
        /// Notifies and kills that named a next switch this one has no port for (its
        /// query or climb never came through here): the notify goes on with
        /// `fail_cause` 2, a kill is dropped.
        no_route,
        // The guards against hosts outside a job (docs/trust.md); each refusal is also
        // counted in the refusal counter of its kind above.
        /// Queries, climbs, notifies and kills whose `true_comm_id` differs from the one the
        /// set-up (or installed group) of their wire id carries: authority is decided on the
        /// 24-bit wire id, so a second high byte cannot make its sender an MRR of the group.
        refused_comm_clash,
        /// Notifies that would add a branch to an installed group coming in on a port that
        /// is none of the group's ports here (its children's, its parent's): only the
        /// group's own set-up extends it (an attacker's notify made it an MRR, then killed it).
        refused_not_group_port,
        /// Queries of a new member for a group installed already (a host that queries under
        /// a running group's id must not become its member), or past its port's share of a
        /// set-up's members (8).
        refused_extra_members,
        /// Hosts that queried under a group's wire id without the set-up key its MRR's
        /// notify carries: left out of the group (a host outside the job that knew the
        /// wire id and queried before the job's notify).
        refused_wrong_key,
        /// Notifies refused because the port they install through holds its share of the
        /// switch's groups already: one host port cannot take every group.
        refused_port_groups,
        /// Set-ups forgotten because their port held its share of the remembered set-ups: a
        /// flood of queries from one port forgets only that port's own.
        port_setups_forgotten,
        /// Control packets refused because their port binds its share of addresses already:
        /// spoofed source addresses cannot fill the binding table for every port.
        refused_port_bindings,
        /// Sweeps of a full binding or host table for expired entries (at most one a second:
        /// a full table is not scanned on every control packet).
        table_sweeps,
        /// Queries, climbs, notifies and kills whose path is none this switch can be on: a
        /// host's query or climb with a pre-filled path (it would poison the uplink map on
        /// its way back down), this switch twice, a notify whose hops are no tree's.
        refused_bad_path,
        /// Host addresses seen below on two ports within the binding TTL: their port is
        /// forgotten (frames for them go down every port below) rather than taken from a
        /// spoofed query.
        host_port_contested,
        /// Control frames from a host port past its rate (`port_rate::FRAMES_PER_SECOND`,
        /// in bursts of `BURST`), dropped unparsed on a TOR: a host flooding the control
        /// plane. Its own set-ups past the rate time out and run on the hosts.
        control_shed,
        /// New set-ups refused because their port's share of the remembered set-ups held
        /// only ones younger than the grace (3 s): a flood from one port cannot forget
        /// another job's set-up between its query and its notify.
        port_setups_refused,
        /// A DPU's requests for a member installed exactly as asked (the host asked again
        /// before the first answer reached it): answered again, the member kept as it runs.
        setups_repeated,
    }
}

const _: () = assert!(core::mem::size_of::<DaemonStats>() == DaemonStats::NAMES.len() * 8);

const _: () = assert!(core::mem::size_of::<PortStats>() == PortStats::NAMES.len() * 8);

impl PortStats {
    /// The counter for a rejection reason.
    #[inline(always)]
    pub fn reason_mut(&mut self, reason: Malformed) -> &mut u64 {
        match reason {
            Malformed::Truncated => &mut self.mal_truncated,
            Malformed::BadLength => &mut self.mal_bad_length,
            Malformed::BadTag => &mut self.mal_bad_tag,
            Malformed::BadKind => &mut self.mal_bad_kind,
            Malformed::BadOp => &mut self.mal_bad_op,
            Malformed::BadType => &mut self.mal_bad_type,
            Malformed::BadCount => &mut self.mal_bad_count,
            Malformed::TooLarge => &mut self.mal_too_large,
            Malformed::BadControl => &mut self.mal_bad_control,
            Malformed::Fragment => &mut self.mal_fragment,
            Malformed::Layout => &mut self.mal_layout,
            Malformed::Handoff => &mut self.mal_handoff,
        }
    }
}

#[cfg(feature = "user")]
// SAFETY: repr(C), only u64 fields, no padding (size asserted above).
unsafe impl aya::Pod for GroupStats {}

#[cfg(feature = "user")]
// SAFETY: repr(C), only u64 fields, no padding (size asserted above).
unsafe impl aya::Pod for DaemonStats {}

#[cfg(feature = "user")]
// SAFETY: repr(C), only u64 fields, no padding (size asserted above).
unsafe impl aya::Pod for PortStats {}
