//! The control plane's guards against hosts outside a job (issue 44): what each refused or
//! contained, by the attack it stops.
//!
//! The pinned `DAEMON_STATS` map has the data plane's layout, so these counters live in the
//! daemon: `innet daemon --metrics` serves them as `innet_daemon_guard_<name>_total`, and
//! each refusal is also counted in the pinned counter of its kind (`refused_not_mrr`,
//! `refused_wrong_port`, `refused_invalid`, `refused_capacity`), which `innet stats` reads.

use std::sync::Mutex;

/// Declares the guard counters with their names and doc comments (HELP lines).
macro_rules! guards {
    ($(#[$meta:meta])* pub struct $name:ident { $($(#[doc = $doc:literal])* $field:ident,)* }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name { $($(#[doc = $doc])* pub $field: u64,)* }

        impl $name {
            /// Each counter's doc comment, in declaration order.
            pub const HELP: &'static [&'static str] = &[$(concat!($($doc),*)),*];

            /// Every counter with its name, in declaration order.
            #[must_use]
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($field), self.$field)),*]
            }
        }
    };
}

guards! {
    /// What the daemon's guards refused or contained.
    pub struct Guards {
        /// Queries, climbs, notifies and kills whose `true_comm_id` differs from the one the
        /// set-up (or installed group) of their wire id carries: authority is decided on the
        /// 24-bit wire id, so a second high byte cannot make its sender an MRR of the group.
        refused_comm_clash,
        /// Notifies that would add a branch to an installed group coming in on a port that
        /// is none of the group's ports here (its children's, its parent's): only the
        /// group's own set-up extends it (an attacker's notify made it an MRR, then killed it).
        refused_not_group_port,
        /// Queries of a new member for a group installed already: a host that queries under
        /// a running group's id must not become its member.
        refused_extra_members,
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
    }
}

/// The guard counters of this process's daemon, as last published (`None`: no daemon runs
/// in this process, as in `innet stats`).
static PUBLISHED: Mutex<Option<Guards>> = Mutex::new(None);

/// Publishes the daemon's guard counters for the metrics endpoint.
pub fn publish(g: &Guards) {
    if let Ok(mut p) = PUBLISHED.lock() {
        *p = Some(*g);
    }
}

/// The guard counters published by this process's daemon, if one runs here.
#[must_use]
pub fn published() -> Option<Guards> {
    PUBLISHED.lock().ok().and_then(|p| *p)
}
