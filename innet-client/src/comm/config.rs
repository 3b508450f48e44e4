//! What a rank asks of its communicator: the mode, where the nodes are, the limits and
//! time budgets of a collective.

use std::{fmt, net::Ipv4Addr, str::FromStr, sync::OnceLock, time::Duration};

use innet_common::proto::MAX_PAYLOAD_BYTES;

use crate::{
    cutover::{CutoverTable, network_max_bytes},
    roles::{Grouping, Layout, RolePlan},
};

/// Default busy-poll budget of a waiting leader ([`Config::spin`]).
pub const DEFAULT_SPIN: Duration = Duration::from_millis(1);

/// Unanswered packets a leader keeps in the network by default ([`Config::pipe`]): the
/// rounds the default window of 16 slots lets it have in flight, which fill a link of the
/// lab's (1500 B packets, four hops) to 0.9 of its rate without a queue behind them.
pub const DEFAULT_PIPE: usize = 8;

/// How collectives run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mode {
    /// Socket mode when every node has a NIC per socket and the ranks split evenly over the
    /// sockets, else Node mode; host algorithms when the network cannot help.
    #[default]
    Auto,
    /// In-network, one leader per node.
    IncNode,
    /// In-network, one leader per CPU socket.
    IncSocket,
    /// Host recursive doubling among node leaders.
    HostRd,
    /// Host ring among node leaders.
    HostRing,
    /// In the node leaders' NICs: a reduction tree of the NIC paper, for fabrics whose switches
    /// do not run innet (each host runs `innet daemon --role nic`).
    IncNic,
    /// The same tree on the nodes' DPUs (BlueField-style SmartNICs, each running `innet
    /// daemon --role dpu`): the hosts run no BPF and send ordinary RoCEv2 frames.
    IncDpu,
}

impl Mode {
    pub const ALL: [Self; 7] = [
        Self::Auto,
        Self::IncNode,
        Self::IncSocket,
        Self::HostRd,
        Self::HostRing,
        Self::IncNic,
        Self::IncDpu,
    ];

    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::IncNode => "inc-node",
            Self::IncSocket => "inc-socket",
            Self::HostRd => "host-rd",
            Self::HostRing => "host-ring",
            Self::IncNic => "inc-nic",
            Self::IncDpu => "inc-dpu",
        }
    }

    /// Whether the mode reduces in TOR/SPINE switches (so the nodes' TORs matter).
    #[must_use]
    pub const fn uses_switches(self) -> bool {
        matches!(self, Self::Auto | Self::IncNode | Self::IncSocket)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|m| m.name()).collect();
                format!("unknown mode {s:?}: use one of {}", names.join(", "))
            })
    }
}

/// Where a node sits: its TOR and its NIC addresses (one per CPU socket for Socket mode;
/// Node mode uses the first).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodePlacement {
    /// The node's TOR, numbered from 0 in node order.
    pub tor: usize,
    pub nics: Vec<Ipv4Addr>,
}

impl NodePlacement {
    #[must_use]
    pub fn new(tor: usize, nics: Vec<Ipv4Addr>) -> Self {
        Self { tor, nics }
    }
}

/// Everything a rank needs to join a communicator. Every rank of the job passes the same
/// values except `rank`. [`Config::new`] (a placement by hand) or
/// [`Config::discover`] (through a [`Bootstrap`](crate::Bootstrap)) make one; its fields
/// may then be changed.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    /// Job id, the same on every rank (names the node-local sockets and the group id).
    pub job: u64,
    pub rank: usize,
    pub layout: Layout,
    /// One entry per node, in rank order; the nodes of a TOR are contiguous.
    pub nodes: Vec<NodePlacement>,
    pub mode: Mode,
    /// Longest a collective (or the setup) may take.
    pub timeout: Duration,
    /// First retransmission timer of a data packet (doubles up to 8×).
    pub retry: Duration,
    /// Sends of one data packet before the collective falls back to the hosts (and at least
    /// `timeout / PATIENCE_SHARE` since the first: a late peer is no lost network).
    pub max_tries: u32,
    /// Largest payload per data packet (the group's `sup_max_data_size` may lower it).
    pub max_packet_bytes: usize,
    /// Fault injection for tests: the leader drops every n-th result it receives (0: none).
    #[cfg(feature = "test-hooks")]
    pub drop_results_every: u32,
    /// `inc-nic`: children per member of the NIC tree (0: the library's choice,
    /// [`Tree::default_degree`](crate::nic::Tree::default_degree)).
    pub branch_degree: usize,
    /// `auto` mode: messages longer than this go to the host algorithms, where they are
    /// faster (from a [`CutoverTable`], see [`Config::with_cutover`]); `None`: no limit.
    pub network_max_bytes: Option<usize>,
    /// How long a leader busy-polls its socket (yielding the CPU in between) before it
    /// blocks, while it waits for a packet in a collective.
    pub spin: Duration,
    /// Send a leader's data packets of equal length as UDP GSO super-datagrams
    /// (`UDP_SEGMENT`): one trip down the kernel's UDP/IP send path for a run of them
    /// instead of one each (kept off on a socket whose kernel refuses it). On unless the
    /// environment sets `INNET_GSO=0`.
    pub gso: bool,
    /// Let the kernel coalesce the results arriving at a leader's INC socket (UDP GRO,
    /// `UDP_GRO`): one trip up the receive path per train of equal-length results, split
    /// into the datagrams again by the library. On unless the environment sets
    /// `INNET_GRO=0`.
    pub gro: bool,
    /// A leader of several ranks overlaps their gather with the network's rounds for
    /// messages longer than a shared-memory slot (their parts fold in as they come, rounds
    /// leave as their bytes are final). Off unless the environment sets `INNET_PIPELINE=1`:
    /// on the lab's two CPUs it measured no faster (0.79–1.03×, docs/bench/pipeline-35),
    /// where every stage is host CPU; it is for fabrics whose network stage is not.
    pub pipeline: bool,
    /// Unanswered packets a leader keeps in the network at most, however far its window
    /// reaches ([`DEFAULT_PIPE`] unless the environment sets `INNET_PIPE`). The window says
    /// how far past a lost round the stream may run while it is resent; the pipe says how
    /// many packets may wait in a queue meanwhile, ahead of that resend.
    pub pipe: usize,
    /// Keep per-stage timestamps of the first this-many collectives
    /// ([`Communicator::stages`](crate::Communicator::stages); 0: none, and no clock is read).
    pub trace_calls: usize,
}

impl Config {
    /// A configuration with the defaults: auto mode, 10 s timeout, 20 ms first retry,
    /// 8 tries, full-size packets, UDP GSO and GRO (see [`Config::gso`]).
    #[must_use]
    pub fn new(job: u64, rank: usize, layout: Layout, nodes: Vec<NodePlacement>) -> Self {
        Self {
            job,
            rank,
            layout,
            nodes,
            mode: Mode::Auto,
            timeout: Duration::from_secs(10),
            retry: Duration::from_millis(20),
            max_tries: 8,
            max_packet_bytes: MAX_PAYLOAD_BYTES,
            #[cfg(feature = "test-hooks")]
            drop_results_every: 0,
            branch_degree: 0,
            spin: DEFAULT_SPIN,
            network_max_bytes: None,
            gso: env_defaults().0,
            gro: env_defaults().1,
            pipeline: env_defaults().2,
            pipe: env_pipe(),
            trace_calls: 0,
        }
    }

    /// Results the leader drops on purpose: every n-th (0: none; only under `test-hooks`).
    #[cfg_attr(
        not(feature = "test-hooks"),
        expect(clippy::unused_self, reason = "the field exists under test-hooks only")
    )]
    pub(crate) fn drop_results_every(&self) -> u32 {
        #[cfg(feature = "test-hooks")]
        return self.drop_results_every;
        #[cfg(not(feature = "test-hooks"))]
        0
    }

    /// The one rule of whether a message of `bytes` may take the network: in `auto` mode
    /// the cutover table hands longer ones to the hosts. `Some(limit)` when it does.
    #[must_use]
    pub fn cutover_limit(&self, bytes: usize) -> Option<usize> {
        crate::policy::table_limit(self.network_max_bytes, bytes)
            .filter(|_| self.mode == Mode::Auto)
    }

    /// Takes `auto` mode's limit for the network path from `table`'s library rules for
    /// this layout.
    #[must_use]
    pub fn with_cutover(mut self, table: &CutoverTable) -> Self {
        self.network_max_bytes = network_max_bytes(
            &table.library,
            self.layout.nodes(),
            self.layout.ranks_per_node,
        );
        self
    }
}

/// The defaults of [`Config::gso`] and [`Config::gro`] (on, unless `INNET_GSO` or
/// `INNET_GRO` is `0`, `off` or `false`) and of [`Config::pipeline`] (off, unless
/// `INNET_PIPELINE` is `1`, `on` or `true`); read once per process.
fn env_defaults() -> (bool, bool, bool) {
    static READ: OnceLock<(bool, bool, bool)> = OnceLock::new();
    *READ.get_or_init(|| {
        let set = |name| {
            std::env::var(name)
                .ok()
                .map(|v| v.trim().to_ascii_lowercase())
        };
        let off = |name| set(name).is_some_and(|v| matches!(v.as_str(), "0" | "off" | "false"));
        let on = |name| set(name).is_some_and(|v| matches!(v.as_str(), "1" | "on" | "true"));
        (!off("INNET_GSO"), !off("INNET_GRO"), on("INNET_PIPELINE"))
    })
}

/// The default of [`Config::pipe`]: `INNET_PIPE` when it is a count from 1, else
/// [`DEFAULT_PIPE`]; read once per process.
fn env_pipe() -> usize {
    static READ: OnceLock<usize> = OnceLock::new();
    *READ.get_or_init(|| {
        let set = std::env::var("INNET_PIPE").ok();
        match set.as_deref().map(str::trim).map(str::parse::<usize>) {
            Some(Ok(n)) if n > 0 => n,
            Some(_) => {
                tracing::warn!(value = ?set, default = DEFAULT_PIPE,
                    "INNET_PIPE is not a count from 1: using the default");
                DEFAULT_PIPE
            }
            None => DEFAULT_PIPE,
        }
    })
}

/// Node or Socket grouping for the configured mode and layout.
pub(super) fn grouping_for(cfg: &Config) -> Grouping {
    match cfg.mode {
        Mode::IncSocket => Grouping::Socket,
        Mode::IncNode | Mode::HostRd | Mode::HostRing | Mode::IncNic | Mode::IncDpu => {
            Grouping::Node
        }
        Mode::Auto => {
            let n = cfg.layout.sockets_per_node;
            let socket_ok = RolePlan::new(cfg.layout, Grouping::Socket).is_ok()
                && cfg.nodes.iter().all(|node| node.nics.len() >= n);
            if socket_ok {
                Grouping::Socket
            } else {
                Grouping::Node
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_name_the_choices() {
        for m in Mode::ALL {
            assert_eq!(m.name().parse::<Mode>(), Ok(m));
        }
        let e = "fast".parse::<Mode>().unwrap_err();
        assert!(e.contains("inc-socket") && e.contains("host-ring"), "{e}");
    }
}
