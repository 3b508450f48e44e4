//! The communicator: one rank's handle on a group of ranks, and its allreduce.
//!
//! A rank's data goes to its leader over the node-local channel; the leaders reduce through
//! the switches (Node or Socket mode) or host to host (recursive doubling, ring); each
//! leader hands the result back to its ranks. Which way a collective went comes back in a
//! [`Report`]: the result is the same either way, and never wrong — a collective the
//! network cannot finish runs on the hosts instead.

use std::{
    fmt, io,
    net::Ipv4Addr,
    str::FromStr,
    time::{Duration, Instant},
};

use innet_common::{
    proto::{
        DEFAULT_PAYLOAD_BYTES, Dtype, LOC_BYTES, MAX_PAYLOAD_BYTES, Op, element_bytes,
        payload_for_mtu,
    },
    reduce::{ReduceError, combine_into},
};
use tracing::{debug, info, warn};

use crate::{
    daemon::{Capabilities, FAIL_CAPACITY, FAIL_NO_ROUTE, FAIL_PORT_CONFLICT, FAIL_REFUSED},
    nic::{FAIL_DPU_REFUSED, FAIL_NO_DPU, FAIL_NO_NIC, NicPort, Tree, TreeError, dpu::DpuRequest},
};

use super::{
    assembly::before,
    cutover::{CutoverTable, network_max_bytes},
    dpu::{self, DpuMember},
    endpoint::{self, Carrier, Endpoint, NetAbort, NetPlan, Notice},
    frames::{self, MASK24},
    handshake::{
        FAIL_NO_SWITCH, FAIL_TOO_LARGE, FAIL_UNSUPPORTED, GroupParams, HandshakeError, Leader,
        Offer, group_id, params,
    },
    hostalg::{self, Algorithm},
    local::{Kind, LocalChannel},
    roles::{Grouping, Layout, LayoutError, Plan, check_tors},
    shm::{NodeSegment, SLOT_BYTES},
    stages::{CallStamps, Stage, StageLog},
};

/// Default busy-poll budget of a waiting leader ([`Config::spin`]).
pub const DEFAULT_SPIN: Duration = Duration::from_millis(1);

/// `fail_cause` a leader records when the handshake itself did not finish.
pub const FAIL_HANDSHAKE: u8 = 6;
/// `fail_cause` the leaders record while they leave the network alone because it keeps
/// losing their group (or for good, when a NIC tree lost it).
pub const FAIL_GROUP_LOST: u8 = 10;
/// A group lost within this many collectives of being set up was lost quickly. After two
/// quick losses in a row the leaders run this many collectives on the hosts before they
/// set the group up again, twice as many after each further quick loss (up to 1024×):
/// a network that keeps losing groups costs a few collectives, not every one.
pub const QUICK_LOSS_CALLS: u32 = 64;

/// A data packet waits at least `timeout / PATIENCE_SHARE` for its result before the
/// collective falls back to the hosts: long enough for a peer that enters the collective
/// late (MPI ranks rarely arrive together), short enough to leave the hosts the rest of
/// the call's time.
pub const PATIENCE_SHARE: u32 = 4;

/// What a group's `fail_cause` means, and what to do about it.
#[must_use]
pub fn explain_fail_cause(fail_cause: u8) -> &'static str {
    match fail_cause {
        0 => "the network serves the group",
        FAIL_CAPACITY => {
            "a switch (or NIC) has no room for another group: free idle ones (`innet group list`, `innet group del`) or raise its capacity"
        }
        FAIL_NO_ROUTE => {
            "a TOR has no route to the group's SPINE (no query came back down its uplinks): check the uplinks and the SPINE's daemon"
        }
        FAIL_UNSUPPORTED => {
            "the switches cannot reduce this op or type: see their capabilities in `innet daemon --help`"
        }
        FAIL_TOO_LARGE => {
            "the packets are larger than the switches accept: lower max_packet_bytes (INNET_MAX_PACKET_BYTES)"
        }
        FAIL_NO_SWITCH => {
            "a query crossed no innet switch: start `innet daemon` on the TORs (and SPINEs) between the hosts"
        }
        FAIL_HANDSHAKE => {
            "the handshake did not finish in time: are all leaders running, and `innet daemon` on the switches?"
        }
        FAIL_NO_NIC => "a leader's host has no NIC daemon: start `innet daemon --role nic` there",
        FAIL_NO_DPU => {
            "no DPU daemon answered a leader (inc-dpu): start `innet daemon --role dpu -i pf0hpf -i p0 --uplink p0 --ip ADDR` on its node's DPU"
        }
        FAIL_DPU_REFUSED => {
            "a leader's DPU could not install the group (no ARP answer from its parent, or a bad request): see the DPU daemon's log"
        }
        FAIL_REFUSED => {
            "a switch refused the group's spec (a reserved id or too many members): see the daemon's log"
        }
        FAIL_PORT_CONFLICT => {
            "a member's address came in on two switch ports during set-up (a host that moved, or one spoofing it): find the second port with `innet stats` (refused_wrong_port); the binding lapses 60 s after the address's last control packet"
        }
        FAIL_GROUP_LOST => {
            "the network lost the group again right after it was set up: the leaders leave it alone for a while (QUICK_LOSS_CALLS collectives, doubling); check the daemons' logs and `innet stats`"
        }
        _ => "unknown cause: see the switches' daemon logs",
    }
}

/// A group that does not use the network, for `fail_cause`.
fn hosts_only(true_comm_id: u32, fail_cause: u8) -> GroupParams {
    GroupParams {
        true_comm_id,
        wire_id: 0,
        spine: Ipv4Addr::UNSPECIFIED,
        ops: 0,
        dtypes: 0,
        max_data_size: 0,
        window: 0,
        fail_cause,
    }
}

/// Everything that can go wrong in a collective.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("send buffer has {send} bytes, receive buffer {recv}: they must be the same size")]
    Buffers { send: usize, recv: usize },
    #[error("{bytes} bytes is not a whole number of {op}/{dtype} elements ({elem} bytes each)", op = op.name(), dtype = dtype.name())]
    Partial {
        bytes: usize,
        elem: usize,
        op: Op,
        dtype: Dtype,
    },
    #[error(transparent)]
    Reduce(#[from] ReduceError),
    #[error("timed out waiting for {what}: are all ranks calling the same collectives?")]
    Timeout { what: &'static str },
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("malformed message from the node's leader")]
    BadLocalMessage,
    #[error("inc-nic: {0}")]
    Tree(#[from] TreeError),
}

/// How collectives run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Socket mode when every node has a NIC per socket and the ranks split evenly over the
    /// sockets, else Node mode; host algorithms when the network cannot help.
    Auto,
    /// In-network, one leader per node.
    IncNode,
    /// In-network, one leader per CPU socket.
    IncSocket,
    /// Host recursive doubling among node leaders.
    HostRd,
    /// Host ring among node leaders.
    HostRing,
    /// In the node leaders' NICs: a reduction tree of seed 001, for fabrics whose switches
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
pub struct NodePlacement {
    pub tor: usize,
    pub nics: Vec<Ipv4Addr>,
}

/// Everything a rank needs to join a communicator. Every rank of the job passes the same
/// values except `rank`.
#[derive(Clone, Debug)]
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
    pub drop_results_every: u32,
    /// `inc-nic`: children per member of the NIC tree (0: the library's choice,
    /// [`Tree::default_degree`]).
    pub branch_degree: usize,
    /// `auto` mode: messages longer than this go to the host algorithms, where they are
    /// faster (from a [`CutoverTable`], see [`Config::with_cutover`]); `None`: no limit.
    pub network_max_bytes: Option<usize>,
    /// How long a leader busy-polls its socket (yielding the CPU in between) before it
    /// blocks, while it waits for a packet in a collective.
    pub spin: Duration,
    /// Keep per-stage timestamps of the first this-many collectives
    /// ([`Communicator::stages`]; 0: none, and no clock is read).
    pub trace_calls: usize,
}

impl Config {
    /// A configuration with the defaults: auto mode, 10 s timeout, 20 ms first retry,
    /// 8 tries, full-size packets.
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
            drop_results_every: 0,
            branch_degree: 0,
            spin: DEFAULT_SPIN,
            network_max_bytes: None,
            trace_calls: 0,
        }
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

/// Which way a collective went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// Through the switches.
    Network(Grouping),
    /// Through the node leaders' NICs (a NIC tree).
    NicTree,
    /// Host to host among the leaders.
    Host(Algorithm),
    /// One leader holds every rank: the node-local reduce was all.
    Local,
}

/// Why a collective that was to use the network ran on the hosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// The handshake says the network cannot serve the group (`fail_cause`).
    NoNetwork { fail_cause: u8 },
    /// The switches cannot reduce this op or type, or not in packets this large.
    Unsupported,
    /// A packet's result did not come after this many sends.
    Timeout { tries: u32 },
    /// Another leader ran it on the hosts (its results did not come).
    PeerFellBack,
    /// `auto` mode: the cutover table gives messages longer than this to the hosts, where
    /// they are faster.
    Cutover { max_bytes: u32 },
    /// A contribution came back unaggregated: the switches no longer hold the group (a
    /// daemon restarted without its state, `innet group del`, the idle timeout). This one
    /// and the next run on the hosts; the one after sets the group up again.
    GroupVanished,
}

/// How one collective ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    pub path: Path,
    pub fallback: Option<Fallback>,
    /// Data packets this leader sent again.
    pub retransmissions: u32,
    /// This collective first set the group up again, because an earlier one found it
    /// gone: the new group's `fail_cause` (0: it runs in the network).
    pub regrouped: Option<u8>,
}

impl Report {
    const BYTES: usize = 14;

    fn encode(&self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        (b[0], b[1]) = match self.path {
            Path::Network(Grouping::Node) => (1, 0),
            Path::Network(Grouping::Socket) => (1, 1),
            Path::NicTree => (1, 2),
            Path::Host(Algorithm::RecursiveDoubling) => (2, 0),
            Path::Host(Algorithm::Ring) => (2, 1),
            Path::Local => (3, 0),
        };
        (b[2], b[3]) = match self.fallback {
            None => (0, 0),
            Some(Fallback::NoNetwork { fail_cause }) => (1, fail_cause),
            Some(Fallback::Unsupported) => (2, 0),
            Some(Fallback::Timeout { tries }) => (3, tries.min(255) as u8),
            Some(Fallback::PeerFellBack) => (4, 0),
            Some(Fallback::Cutover { max_bytes }) => {
                b[8..12].copy_from_slice(&max_bytes.to_le_bytes());
                (5, 0)
            }
            Some(Fallback::GroupVanished) => (6, 0),
        };
        b[4..8].copy_from_slice(&self.retransmissions.to_le_bytes());
        (b[12], b[13]) = self.regrouped.map_or((0, 0), |c| (1, c));
        b
    }

    fn decode(b: &[u8]) -> Option<Self> {
        let b: &[u8; Self::BYTES] = b.get(..Self::BYTES)?.try_into().ok()?;
        let path = match (b[0], b[1]) {
            (1, 0) => Path::Network(Grouping::Node),
            (1, 1) => Path::Network(Grouping::Socket),
            (1, 2) => Path::NicTree,
            (2, 0) => Path::Host(Algorithm::RecursiveDoubling),
            (2, 1) => Path::Host(Algorithm::Ring),
            (3, 0) => Path::Local,
            _ => return None,
        };
        let fallback = match (b[2], b[3]) {
            (0, _) => None,
            (1, c) => Some(Fallback::NoNetwork { fail_cause: c }),
            (2, _) => Some(Fallback::Unsupported),
            (3, t) => Some(Fallback::Timeout {
                tries: u32::from(t),
            }),
            (4, _) => Some(Fallback::PeerFellBack),
            (5, _) => Some(Fallback::Cutover {
                max_bytes: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            }),
            (6, _) => Some(Fallback::GroupVanished),
            _ => return None,
        };
        Some(Self {
            path,
            fallback,
            retransmissions: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            regrouped: (b[12] == 1).then_some(b[13]),
        })
    }
}

/// Converts between the caller's native element order and the wire's big-endian order (its
/// own inverse). MINLOC/MAXLOC elements are a value followed by an `i32` location.
pub fn swap_order(op: Op, dtype: Dtype, buf: &mut [u8]) {
    if cfg!(target_endian = "big") {
        return;
    }
    let (w, e) = (dtype.width(), element_bytes(op, dtype));
    // Plain elements of a fixed width compile to byte swaps (a long message's two passes).
    if w == e {
        match w {
            1 => {}
            2 => reverse_each::<2>(buf),
            4 => reverse_each::<4>(buf),
            8 => reverse_each::<8>(buf),
            _ => buf.chunks_exact_mut(w).for_each(<[u8]>::reverse),
        }
        return;
    }
    for el in buf.chunks_exact_mut(e) {
        el[..w].reverse();
        if op.carries_location() {
            el[w..w + LOC_BYTES].reverse();
        }
    }
}

fn reverse_each<const W: usize>(buf: &mut [u8]) {
    for el in buf.chunks_exact_mut(W) {
        el.reverse();
    }
}

/// One rank's membership in a communicator.
pub struct Communicator {
    cfg: Config,
    plan: Plan,
    /// This rank's leader.
    leader: usize,
    local: LocalChannel,
    /// The leader's network side (leaders only).
    endpoint: Option<Endpoint>,
    /// `inc-nic` leaders: this host's member of the NIC tree, and what it offered.
    nic: Option<NicPort>,
    /// `inc-dpu` leaders: this node's member on its DPU.
    dpu: Option<DpuMember>,
    offer: Option<Offer>,
    group: Option<GroupParams>,
    tor_of: Vec<usize>,
    seq: u32,
    /// The node's shared-memory segment (nodes of more than one rank).
    segment: Option<NodeSegment>,
    /// Reused message buffer of the node-local steps.
    scratch: Vec<u8>,
    /// Reused wire-order copy of the message in a collective.
    wire: Vec<u8>,
    /// Per-stage timestamps of traced collectives.
    stages: StageLog,
    /// The leaders' record of lost groups.
    losses: Losses,
}

/// What the leaders know of their lost groups (the same on every leader: it changes only
/// at collectives every leader reaches).
#[derive(Default)]
struct Losses {
    /// The collective before which the group in use was set up.
    set_up_at: u32,
    /// Groups lost quickly in a row ([`QUICK_LOSS_CALLS`]).
    quick: u32,
    /// The leaders leave the network alone until this collective.
    hosts_until: Option<u32>,
}

impl Communicator {
    /// Joins the communicator: validates the layout, binds the node-local channel and (as a
    /// leader) the INC socket, and in the in-network modes runs the control-plane handshake
    /// of seed 000. Every rank of the job must call it; it returns when this rank's part is
    /// done.
    ///
    /// A handshake that does not finish is not an error: the collectives then run on the
    /// hosts, reported as [`Fallback::NoNetwork`].
    ///
    /// # Errors
    /// A bad layout or placement, a socket that cannot be bound, or (on a non-leader) no
    /// parameters from the leader in time.
    pub fn new(cfg: Config) -> Result<Self, Error> {
        let layout = cfg.layout;
        if cfg.rank >= layout.size {
            return Err(LayoutError::RankOutOfRange {
                rank: cfg.rank,
                size: layout.size,
            }
            .into());
        }
        if cfg.nodes.len() != layout.nodes() {
            return Err(LayoutError::Placement {
                given: cfg.nodes.len(),
                nodes: layout.nodes(),
            }
            .into());
        }
        let tor_of: Vec<usize> = cfg.nodes.iter().map(|n| n.tor).collect();
        check_tors(&tor_of)?;
        let grouping = grouping_for(&cfg);
        let plan = Plan::new(layout, grouping)?;
        let nics = if grouping == Grouping::Socket {
            plan.mrrs
        } else {
            1
        };
        if let Some((node, n)) = cfg
            .nodes
            .iter()
            .enumerate()
            .find(|(_, n)| n.nics.len() < nics)
        {
            return Err(LayoutError::TooFewNics {
                node,
                nics: n.nics.len(),
                sockets: nics,
            }
            .into());
        }
        let leader = plan.leader_of(cfg.rank);
        let deadline = Instant::now() + cfg.timeout;
        let local = LocalChannel::bind(cfg.job, cfg.rank as u32)?;
        let node_ranks = plan.members(leader).len();
        let segment = if node_ranks > 1 {
            let leader_rank = plan.leader_rank(leader);
            Some(NodeSegment::open(
                cfg.job,
                leader_rank,
                node_ranks,
                cfg.spin,
            )?)
        } else {
            None
        };
        let in_network = matches!(
            cfg.mode,
            Mode::Auto | Mode::IncNode | Mode::IncSocket | Mode::IncNic | Mode::IncDpu
        ) && plan.leaders() > 1;
        let degree = match cfg.branch_degree {
            0 => Tree::default_degree(plan.leaders()),
            k => k,
        };
        if matches!(cfg.mode, Mode::IncNic | Mode::IncDpu) && plan.leaders() > 1 {
            Tree::new(plan.leaders(), degree)?;
        }
        let mut me = Self {
            plan,
            leader,
            endpoint: None,
            nic: None,
            dpu: None,
            offer: None,
            group: None,
            tor_of,
            seq: 0,
            segment,
            scratch: vec![],
            wire: vec![],
            stages: StageLog::new(cfg.trace_calls),
            losses: Losses::default(),
            local,
            cfg,
        };
        let leader_rank = plan.leader_rank(leader);
        if leader_rank == me.cfg.rank && plan.leaders() > 1 {
            me.start_leader(grouping, degree, in_network, deadline)?;
        } else if in_network {
            me.group = Some(
                me.local
                    .recv_params(leader_rank as u32, deadline)
                    .map_err(|e| {
                        if e.kind() == io::ErrorKind::TimedOut {
                            Error::Timeout {
                                what: "the group parameters from this node's leader",
                            }
                        } else {
                            Error::Io(e)
                        }
                    })?,
            );
        }
        Ok(me)
    }

    /// A leader's setup: its INC endpoint, its NIC tree member (`inc-nic`), the handshake
    /// (in-network modes), and the group parameters for its node's ranks.
    fn start_leader(
        &mut self,
        grouping: Grouping,
        degree: usize,
        in_network: bool,
        deadline: Instant,
    ) -> Result<(), Error> {
        let ips: Vec<Ipv4Addr> = (0..self.plan.leaders())
            .map(|i| {
                let (node, socket) = self.plan.node_of(i);
                self.cfg.nodes[node].nics[if grouping == Grouping::Socket {
                    socket
                } else {
                    0
                }]
            })
            .collect();
        if self.cfg.mode == Mode::IncNic {
            self.join_nic_tree(&ips, degree);
        }
        let comm = group_id(self.cfg.job, 0);
        let mut ep = Endpoint::bind(
            self.leader,
            ips.clone(),
            (comm, group_id(self.cfg.job, 1)),
            frames::job_pkey(self.cfg.job),
            self.cfg.spin,
        )?;
        if self.cfg.mode == Mode::IncDpu {
            self.join_dpu(&ep, &ips, degree)?;
        }
        if in_network {
            let group = self.handshake(&ep, comm, None).unwrap_or_else(|e| {
                warn!(error = %e, "the handshake did not finish: collectives run on the hosts");
                hosts_only(comm, FAIL_HANDSHAKE)
            });
            if !group.in_network() {
                warn!(
                    fail_cause = group.fail_cause,
                    "the network cannot serve this communicator, collectives run on the hosts: {}",
                    explain_fail_cause(group.fail_cause)
                );
                // Frees this member's part of the NIC tree, if any.
                self.nic = None;
                self.dpu = None;
            }
            let srs: Vec<u32> = self.members().skip(1).map(|r| r as u32).collect();
            self.local.share_params(&srs, &group, deadline)?;
            self.group = Some(group);
        }
        ep.start()?;
        self.endpoint = Some(ep);
        Ok(())
    }

    /// `inc-nic` leader: asks this host's NIC daemon for its member of the tree over the
    /// leaders' NICs. A refusal is not an error: the handshake carries its `fail_cause`, and
    /// the group then runs on the hosts.
    fn join_nic_tree(&mut self, ips: &[Ipv4Addr], degree: usize) {
        let wire_id = group_id(self.cfg.job, 0) & frames::MASK24;
        match NicPort::install(wire_id, ips, degree, self.leader, self.cfg.timeout) {
            Ok(port) => {
                self.offer = Some(Offer {
                    caps: port.caps,
                    fail_cause: 0,
                });
                self.nic = Some(port);
            }
            Err(e) => {
                warn!(error = %e, "no NIC tree member on this host: collectives run on the hosts");
                self.offer = Some(Offer {
                    caps: Capabilities {
                        ops: 0,
                        dtypes: 0,
                        max_data_size: 0,
                        window: 0,
                    },
                    fail_cause: e.fail_cause(),
                });
            }
        }
    }

    /// `inc-dpu` leader: asks this node's DPU for its member of the tree over the leaders.
    /// No answer or a refusal is not an error: the handshake carries the `fail_cause`.
    fn join_dpu(&mut self, ep: &Endpoint, ips: &[Ipv4Addr], degree: usize) -> Result<(), Error> {
        let tree = Tree::new(ips.len(), degree)?;
        let me = self.leader;
        let parent = tree.parent(me);
        let req = DpuRequest {
            comm: group_id(self.cfg.job, 0),
            me: me as u32,
            tree,
            parent: parent.map(|p| ips[p]),
            root: ips[0],
        };
        // Addressed to another member: without a DPU daemon nobody answers.
        let via = ips[parent.unwrap_or(1)];
        let rank = self.cfg.rank as u32;
        let offer = match dpu::join(&ep.sock, (ep.ip(), rank), via, &req, self.cfg.timeout)? {
            Ok((caps, member)) => {
                self.dpu = Some(member);
                Offer {
                    caps,
                    fail_cause: 0,
                }
            }
            Err(fail_cause) => {
                warn!(
                    fail_cause,
                    "no DPU member for this node: collectives run on the hosts: {}",
                    explain_fail_cause(fail_cause)
                );
                Offer {
                    caps: Capabilities {
                        ops: 0,
                        dtypes: 0,
                        max_data_size: 0,
                        window: 0,
                    },
                    fail_cause,
                }
            }
        };
        self.offer = Some(offer);
        Ok(())
    }

    /// The leader's part of the handshake: query (NMRR), collect and notify (MRR), and in
    /// Socket mode the MRRs' synchronisation through the first MRR.
    /// `running`: the group is set up again under a running job, whose peers may still
    /// need this leader's answers meanwhile.
    fn handshake(
        &self,
        ep: &Endpoint,
        comm: u32,
        during_call: Option<Instant>,
    ) -> Result<GroupParams, HandshakeError> {
        let plan = &self.plan;
        let me = self.leader;
        let aside = |d: &[u8], from| ep.aside(d, from);
        let side = self.handshake_side(ep);
        // Inside a collective the set-up shares the call's bound: the call still ends in
        // time, on the hosts if the set-up did not finish.
        let hs = Leader {
            aside: during_call.map(|_| &aside as _),
            timeout: during_call.map_or(side.timeout, |d| {
                side.timeout
                    .min(d.saturating_duration_since(Instant::now()))
            }),
            ..side
        };
        let leaders = plan.leaders() as u16;
        if !plan.is_mrr(me) {
            return hs.join(ep.ip_of(plan.query_target(me)), comm, leaders);
        }
        let told = self.told_ips(ep);
        let notify = if me == 0 {
            let heard = hs.collect(&told, comm)?;
            hs.decide(&heard, comm, leaders, None)
        } else {
            let heard = hs.collect(&told, comm)?;
            hs.sync(ep.ip_of(0), comm, leaders, &heard)?
        };
        hs.notify(&told, &notify)?;
        ep.remember_notify(notify, told);
        Ok(params(comm, &notify))
    }

    /// This leader's end of the control plane, on its INC socket.
    fn handshake_side<'a>(&self, ep: &'a Endpoint) -> Leader<'a> {
        Leader {
            sock: &ep.sock,
            ip: ep.ip(),
            rank: self.cfg.rank as u32,
            timeout: self.cfg.timeout,
            retry: self.cfg.retry.max(Duration::from_millis(100)),
            offer: self.offer,
            payload: link_payload(ep.ip(), self.cfg.max_packet_bytes),
            aside: None,
        }
    }

    fn members(&self) -> std::ops::Range<usize> {
        self.plan.members(self.leader)
    }

    #[must_use]
    pub fn size(&self) -> usize {
        self.cfg.layout.size
    }

    #[must_use]
    pub fn rank(&self) -> usize {
        self.cfg.rank
    }

    #[must_use]
    pub fn ranks_per_node(&self) -> usize {
        self.cfg.layout.ranks_per_node
    }

    #[must_use]
    pub fn sockets_per_node(&self) -> usize {
        self.cfg.layout.sockets_per_node
    }

    /// Node or Socket grouping, as chosen from the mode and layout.
    #[must_use]
    pub fn grouping(&self) -> Grouping {
        self.plan.grouping
    }

    /// What the handshake set up (in-network modes): on a leader, the group in use (set up
    /// again when the network lost it, see [`Report::regrouped`]); on the other ranks, the
    /// one set up when the communicator was made.
    #[must_use]
    pub fn group(&self) -> Option<GroupParams> {
        self.group
    }

    /// Per-stage timestamps of the traced collectives so far ([`Config::trace_calls`]).
    #[must_use]
    pub fn stages(&self) -> &[CallStamps] {
        self.stages.calls()
    }

    /// Forgets the traced collectives and traces the next `calls` ones.
    pub fn trace_calls(&mut self, calls: usize) {
        self.stages.restart(calls);
    }

    /// `recv = send₀ OP send₁ OP …` over every rank. Buffers hold native-order elements of
    /// `dtype` (MINLOC/MAXLOC: each value followed by an `i32` location), any count.
    /// Blocks until the result is here or the timeout passes.
    ///
    /// # Errors
    /// Mismatched or partial buffers, a type the hosts cannot reduce, a timeout (a rank
    /// that does not call), or a socket error.
    pub fn allreduce(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        op: Op,
        dtype: Dtype,
    ) -> Result<Report, Error> {
        if send.len() != recv.len() {
            return Err(Error::Buffers {
                send: send.len(),
                recv: recv.len(),
            });
        }
        let elem = element_bytes(op, dtype);
        if !send.len().is_multiple_of(elem) {
            return Err(Error::Partial {
                bytes: send.len(),
                elem,
                op,
                dtype,
            });
        }
        if !op.defined_on(dtype) {
            return Err(ReduceError::Undefined(op, dtype).into());
        }
        let mut stamps = self.stages.start();
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let deadline = Instant::now() + self.cfg.timeout;
        let mut wire = std::mem::take(&mut self.wire);
        wire.clear();
        wire.extend_from_slice(send);
        swap_order(op, dtype, &mut wire);
        let report = self.allreduce_wire(seq, (op, dtype), &mut wire, deadline, &mut stamps);
        if report.is_ok() {
            swap_order(op, dtype, &mut wire);
            recv.copy_from_slice(&wire);
            self.stages.keep(stamps);
        }
        self.wire = wire;
        report
    }

    /// [`allreduce`](Self::allreduce) of a wire-order message, in place.
    fn allreduce_wire(
        &mut self,
        seq: u32,
        (op, dtype): (Op, Dtype),
        wire: &mut [u8],
        deadline: Instant,
        stamps: &mut CallStamps,
    ) -> Result<Report, Error> {
        let leader_rank = self.plan.leader_rank(self.leader);
        let timeout = |e: io::Error, what| {
            if e.kind() == io::ErrorKind::TimedOut {
                Error::Timeout { what }
            } else {
                Error::Io(e)
            }
        };
        // Messages that fit a slot meet in the node's shared memory, longer ones go
        // through the node-local datagram channel.
        let shm = self.segment.is_some() && wire.len() + Report::BYTES <= SLOT_BYTES;
        let report = if self.cfg.rank == leader_rank {
            if shm {
                self.gather_shared(seq, (op, dtype), wire, deadline)
            } else {
                self.gather_datagrams(seq, (op, dtype), wire, deadline)
            }
            .map_err(|e| match e {
                Error::Io(e) => timeout(e, "the contributions of this node's ranks"),
                e => e,
            })?;
            stamps.stamp(Stage::Gathered);
            let report = self.leaders_allreduce(seq, (op, dtype), wire, deadline, stamps);
            // Until the next collective, the progress thread answers for this leader.
            if let Some(ep) = self.endpoint.as_mut() {
                ep.idle();
            }
            let report = report?;
            self.scratch.clear();
            self.scratch.extend_from_slice(&report.encode());
            self.scratch.extend_from_slice(wire);
            if let Some(seg) = self.segment.as_ref().filter(|_| shm) {
                seg.post(0, seq, &self.scratch);
            } else {
                for r in self.members().skip(1) {
                    self.local
                        .send_msg(r as u32, Kind::Result, seq, &self.scratch, deadline)?;
                }
            }
            report
        } else {
            let msg = if let Some(seg) = self.segment.as_ref().filter(|_| shm) {
                seg.post(self.cfg.rank - leader_rank, seq, wire);
                stamps.stamp(Stage::Gathered);
                let mut msg = std::mem::take(&mut self.scratch);
                let got = seg.wait(0, seq, deadline, &mut msg);
                got.map_err(|e| timeout(e, "the result from this node's leader"))?;
                msg
            } else {
                self.local
                    .send_msg(leader_rank as u32, Kind::Contribution, seq, wire, deadline)?;
                stamps.stamp(Stage::Gathered);
                self.local
                    .recv_msg(Kind::Result, seq, Some(leader_rank as u32), deadline)
                    .map_err(|e| timeout(e, "the result from this node's leader"))?
                    .1
            };
            let report = Report::decode(&msg).ok_or(Error::BadLocalMessage)?;
            let data = &msg[Report::BYTES..];
            if data.len() != wire.len() {
                return Err(Error::BadLocalMessage);
            }
            wire.copy_from_slice(data);
            self.scratch = msg;
            report
        };
        Ok(report)
    }

    /// Leader: combines the contributions of its node's ranks from the shared-memory slots
    /// into `wire`; slot order is rank order, so float results do not depend on timing.
    fn gather_shared(
        &mut self,
        seq: u32,
        (op, dtype): (Op, Dtype),
        wire: &mut [u8],
        deadline: Instant,
    ) -> Result<(), Error> {
        let seg = self.segment.as_ref().expect("a node of several ranks");
        for slot in 1..self.plan.members(self.leader).len() {
            seg.wait(slot, seq, deadline, &mut self.scratch)?;
            same_size(self.cfg.rank + slot, &self.scratch, wire)?;
            combine_into(op, dtype, wire, &self.scratch)?;
        }
        Ok(())
    }

    /// Leader: combines the contributions of its node's ranks from the datagram channel
    /// into `wire`, in rank order (not arrival order: float results must not depend on
    /// timing).
    fn gather_datagrams(
        &mut self,
        seq: u32,
        (op, dtype): (Op, Dtype),
        wire: &mut [u8],
        deadline: Instant,
    ) -> Result<(), Error> {
        let mut parts = Vec::with_capacity(self.members().len() - 1);
        for _ in self.members().skip(1) {
            let (from, d) = self
                .local
                .recv_msg(Kind::Contribution, seq, None, deadline)?;
            same_size(from as usize, &d, wire)?;
            parts.push((from, d));
        }
        parts.sort_by_key(|(from, _)| *from);
        for (_, d) in &parts {
            combine_into(op, dtype, wire, d)?;
        }
        Ok(())
    }

    /// The leaders' part: through the network when it can, else on the hosts.
    fn leaders_allreduce(
        &mut self,
        seq: u32,
        (op, dtype): (Op, Dtype),
        wire: &mut [u8],
        deadline: Instant,
        stamps: &mut CallStamps,
    ) -> Result<Report, Error> {
        let mut report = Report {
            path: Path::Local,
            fallback: None,
            retransmissions: 0,
            regrouped: None,
        };
        // A single leader (one node) has no endpoint: the local reduce was everything.
        if self.endpoint.is_none() {
            return Ok(report);
        }
        let algorithm = match self.cfg.mode {
            Mode::HostRd => Algorithm::RecursiveDoubling,
            Mode::HostRing => Algorithm::Ring,
            Mode::Auto | Mode::IncNode | Mode::IncSocket | Mode::IncNic | Mode::IncDpu => {
                if self.through_network(seq, (op, dtype), wire, (deadline, stamps), &mut report) {
                    return Ok(report);
                }
                Algorithm::for_bytes(wire.len())
            }
        };
        let (n, me) = (self.plan.leaders(), self.leader);
        let ep = self.endpoint.as_mut().expect("a leader of several");
        report.path = Path::Host(algorithm);
        let mut x = ep.exchange(seq, (op, dtype), wire.len(), deadline, self.cfg.retry);
        hostalg::allreduce(algorithm, &mut x, me, n, op, dtype, wire)?;
        ep.keep_final(seq, op, dtype, wire);
        Ok(report)
    }

    /// The in-network modes: reduces `wire` through the network, setting the group up
    /// again first when an earlier collective found it gone. Whether it did; if not,
    /// `report` says why.
    fn through_network(
        &mut self,
        seq: u32,
        (op, dtype): (Op, Dtype),
        wire: &mut [u8],
        (deadline, stamps): (Instant, &mut CallStamps),
        report: &mut Report,
    ) -> bool {
        // Twice at most: a leader that learns only now that the others set the group up
        // again after an earlier collective does so too, then sends again.
        for attempt in 0..2 {
            if let Some(n) = self.endpoint.as_ref().and_then(|ep| ep.regroup_due(seq)) {
                report.regrouped = Some(self.regroup(n, seq, deadline));
            } else if self
                .losses
                .hosts_until
                .is_some_and(|until| !before(seq & MASK24, until))
            {
                // The pause is over, on every leader at this same collective.
                let generation = self.endpoint.as_ref().map_or(0, Endpoint::generation);
                let n = Notice {
                    generation: generation + 1,
                    seq: seq.wrapping_sub(2),
                };
                report.regrouped = Some(self.regroup(n, seq, deadline));
            }
            let me = self.leader;
            let carrier = if let Some(port) = &self.nic {
                Carrier::Nic(port)
            } else {
                let mut dst = self.plan.ring_successor(me, &self.tor_of);
                if dst == me {
                    // Alone under its TOR: any other leader's address makes the packet
                    // cross the TOR, which consumes it; the result comes back as the
                    // packet's reply.
                    dst = (me + 1) % self.plan.leaders();
                }
                Carrier::Switch { dst }
            };
            let cutover = self
                .cfg
                .network_max_bytes
                .filter(|&max| self.cfg.mode == Mode::Auto && wire.len() > max);
            if let Some(max) = cutover {
                report.fallback = Some(Fallback::Cutover {
                    max_bytes: u32::try_from(max).unwrap_or(u32::MAX),
                });
                return false;
            }
            let plan = match self
                .group
                .map(|g| net_plan(&g, op, dtype, &self.cfg, carrier))
            {
                Some(Ok(plan)) => plan,
                Some(Err(f)) => {
                    report.fallback = Some(f);
                    return false;
                }
                None => return false,
            };
            let ep = self.endpoint.as_mut().expect("a leader of several");
            match ep.network_allreduce(seq, (op, dtype), &plan, wire, stamps) {
                Ok(retransmissions) => {
                    ep.keep_final(seq, op, dtype, wire);
                    report.path = match plan.carrier {
                        Carrier::Nic(_) => Path::NicTree,
                        // The DPUs' tree: the frames go through the switches' ports, the
                        // reduction is the NIC tree's.
                        Carrier::Switch { .. } if self.dpu.is_some() => Path::NicTree,
                        Carrier::Switch { .. } => Path::Network(self.plan.grouping),
                    };
                    report.retransmissions = retransmissions;
                    return true;
                }
                Err(NetAbort::Regroup) if attempt == 0 => {}
                Err(abort) => {
                    debug!(seq, ?abort, "the network did not deliver: host allreduce");
                    report.fallback = Some(match abort {
                        NetAbort::Timeout { tries } => Fallback::Timeout { tries },
                        NetAbort::PeerFellBack | NetAbort::Regroup => Fallback::PeerFellBack,
                        NetAbort::Vanished => Fallback::GroupVanished,
                    });
                    if matches!(abort, NetAbort::Timeout { .. } | NetAbort::Vanished) {
                        warn!(
                            seq,
                            ?abort,
                            "the network lost this communicator's group: this collective and the next run on the hosts, then the group is set up again"
                        );
                        ep.announce_loss(seq);
                    }
                    return false;
                }
            }
        }
        report.fallback = Some(Fallback::PeerFellBack);
        false
    }

    /// Before collective `seq`, sets the group up again as notice `n` says (a new id, so
    /// nothing left of the old one on some switch mixes in) — or, after quick losses in a
    /// row, leaves the network alone for a while (every leader decides the same from the
    /// same collective numbers); a NIC tree is not built again. The MRR first frees what
    /// is left of the old group. The set-up ends by the call's `deadline`. Returns the new
    /// group's `fail_cause`.
    fn regroup(&mut self, n: Notice, seq: u32, deadline: Instant) -> u8 {
        let Some(mut ep) = self.endpoint.take() else {
            return FAIL_GROUP_LOST;
        };
        if let Some(old) = self.group.filter(GroupParams::in_network) {
            self.kill_group(&ep, old.true_comm_id);
        }
        let comm = group_id(self.cfg.job, n.generation);
        let next = group_id(self.cfg.job, n.generation.wrapping_add(1));
        // Resuming after a pause is no loss: the count of quick losses stays.
        let resumed = self.losses.hosts_until.take().is_some();
        let quick =
            !resumed && (n.seq.wrapping_sub(self.losses.set_up_at) & MASK24) < QUICK_LOSS_CALLS;
        if quick {
            self.losses.quick += 1;
        } else if !resumed {
            self.losses.quick = 0;
        }
        self.losses.set_up_at = seq & MASK24;
        if quick && self.losses.quick >= 2 {
            let pause = QUICK_LOSS_CALLS << (self.losses.quick - 2).min(10);
            self.losses.hosts_until = Some(seq.wrapping_add(pause) & MASK24);
        }
        // A NIC tree's members are installed at set-up only: it is not built again.
        let stay = self.losses.hosts_until.is_some()
            || matches!(self.cfg.mode, Mode::IncNic | Mode::IncDpu);
        let switched = ep.switch_group(n.generation, (!stay).then_some(comm), next);
        let group = match switched {
            Err(e) => {
                warn!(error = %e, "the new group's id is taken on this address");
                hosts_only(comm, FAIL_GROUP_LOST)
            }
            Ok(()) if stay => hosts_only(comm, FAIL_GROUP_LOST),
            Ok(()) => self
                .handshake(&ep, comm, Some(deadline))
                .unwrap_or_else(|e| {
                    warn!(error = %e, "setting the group up again did not finish");
                    hosts_only(comm, FAIL_HANDSHAKE)
                }),
        };
        if group.in_network() {
            info!(
                generation = n.generation,
                group = format_args!("{:#08x}", group.wire_id),
                "the group is set up again: collectives run in the network"
            );
        } else {
            self.nic = None;
            self.dpu = None;
            warn!(
                generation = n.generation,
                fail_cause = group.fail_cause,
                "the group is not set up again, collectives run on the hosts: {}",
                explain_fail_cause(group.fail_cause)
            );
        }
        self.endpoint = Some(ep);
        self.group = Some(group);
        group.fail_cause
    }

    /// MRR: frees group `comm` on the switches (no-op on other leaders).
    fn kill_group(&self, ep: &Endpoint, comm: u32) {
        let me = self.leader;
        if !self.plan.is_mrr(me) {
            return;
        }
        if let Err(e) = self.handshake_side(ep).kill(&self.told_ips(ep), comm) {
            warn!(error = %e, "sending the kill failed: the switches' idle collection frees the group");
        }
    }

    /// MRR: the addresses of the leaders it notifies (and kills the group for).
    fn told_ips(&self, ep: &Endpoint) -> Vec<Ipv4Addr> {
        let told = self.plan.told_by(self.leader).into_iter();
        told.map(|i| ep.ip_of(i)).collect()
    }
}

/// A node rank's contribution must be as long as its leader's buffer.
fn same_size(from: usize, contribution: &[u8], wire: &[u8]) -> Result<(), Error> {
    if contribution.len() == wire.len() {
        return Ok(());
    }
    warn!(from, "a rank passed another buffer size");
    Err(Error::Buffers {
        send: contribution.len(),
        recv: wire.len(),
    })
}

/// Node or Socket grouping for the configured mode and layout.
fn grouping_for(cfg: &Config) -> Grouping {
    match cfg.mode {
        Mode::IncSocket => Grouping::Socket,
        Mode::IncNode | Mode::HostRd | Mode::HostRing | Mode::IncNic | Mode::IncDpu => {
            Grouping::Node
        }
        Mode::Auto => {
            let n = cfg.layout.sockets_per_node;
            let socket_ok = Plan::new(cfg.layout, Grouping::Socket).is_ok()
                && cfg.nodes.iter().all(|node| node.nics.len() >= n);
            if socket_ok {
                Grouping::Socket
            } else {
                Grouping::Node
            }
        }
    }
}

/// The largest payload the link holding `ip` carries (its MTU's), at most `max`; the
/// 1500 B MTU's when the link cannot be read.
fn link_payload(ip: Ipv4Addr, max: usize) -> u16 {
    let mtu = crate::netdev::ifname_of(ip).and_then(|i| crate::netdev::mtu(&i).ok());
    let payload = mtu.map_or(DEFAULT_PAYLOAD_BYTES, payload_for_mtu);
    u16::try_from(payload.min(max)).unwrap_or(u16::MAX)
}

/// How this leader sends a collective into the network, or why it cannot.
fn net_plan<'a>(
    g: &GroupParams,
    op: Op,
    dtype: Dtype,
    cfg: &Config,
    carrier: Carrier<'a>,
) -> Result<NetPlan<'a>, Fallback> {
    if g.fail_cause != 0 {
        return Err(Fallback::NoNetwork {
            fail_cause: g.fail_cause,
        });
    }
    let limit = usize::from(g.max_data_size)
        .min(cfg.max_packet_bytes)
        .min(MAX_PAYLOAD_BYTES);
    if g.ops & (1 << op as u8) == 0
        || g.dtypes & (1 << dtype as u8) == 0
        || element_bytes(op, dtype) > limit
    {
        return Err(Fallback::Unsupported);
    }
    Ok(NetPlan {
        wire_id: g.wire_id,
        carrier,
        packet_bytes: frames::packet_bytes(op, dtype, limit),
        in_flight: endpoint::in_flight(g.window),
        retry: cfg.retry,
        max_tries: cfg.max_tries.max(1),
        patience: cfg.timeout / PATIENCE_SHARE,
        drop_every: cfg.drop_results_every,
    })
}

impl Drop for Communicator {
    /// Leaders wait (up to the timeout) until every leader is done, answering late
    /// requests meanwhile; then the MRRs free the group on the switches.
    fn drop(&mut self) {
        let Some(mut ep) = self.endpoint.take() else {
            return;
        };
        ep.close(self.seq, Instant::now() + self.cfg.timeout);
        // Every leader is done: this host's part of a NIC tree can go.
        if self.nic.take().is_some() || self.dpu.take().is_some() {
            return;
        }
        if let Some(g) = self.group.filter(GroupParams::in_network) {
            self.kill_group(&ep, g.true_comm_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_survive_the_local_channel() {
        for path in [
            Path::Network(Grouping::Node),
            Path::Network(Grouping::Socket),
            Path::Host(Algorithm::RecursiveDoubling),
            Path::Host(Algorithm::Ring),
            Path::Local,
        ] {
            for fallback in [
                None,
                Some(Fallback::NoNetwork { fail_cause: 5 }),
                Some(Fallback::Unsupported),
                Some(Fallback::Timeout { tries: 8 }),
                Some(Fallback::PeerFellBack),
                Some(Fallback::Cutover { max_bytes: 70_000 }),
                Some(Fallback::GroupVanished),
            ] {
                for regrouped in [None, Some(0), Some(FAIL_GROUP_LOST)] {
                    let r = Report {
                        path,
                        fallback,
                        retransmissions: 77,
                        regrouped,
                    };
                    assert_eq!(Report::decode(&r.encode()), Some(r));
                }
            }
        }
    }

    #[test]
    fn native_order_round_trips_and_minloc_keeps_pairs() {
        let mut b = vec![];
        b.extend_from_slice(&(-5i32).to_ne_bytes());
        b.extend_from_slice(&7i32.to_ne_bytes());
        let orig = b.clone();
        swap_order(Op::Minloc, Dtype::I32, &mut b);
        assert_eq!(&b[..4], &(-5i32).to_be_bytes());
        assert_eq!(&b[4..], &7i32.to_be_bytes());
        swap_order(Op::Minloc, Dtype::I32, &mut b);
        assert_eq!(b, orig);
    }

    #[test]
    fn modes_parse_and_name_the_choices() {
        for m in Mode::ALL {
            assert_eq!(m.name().parse::<Mode>(), Ok(m));
        }
        let e = "fast".parse::<Mode>().unwrap_err();
        assert!(e.contains("inc-socket") && e.contains("host-ring"), "{e}");
    }

    fn single_node(rank: usize, size: usize, job: u64) -> Config {
        let layout = Layout::new(size, size, 1).unwrap();
        let mut c = Config::new(
            job,
            rank,
            layout,
            vec![NodePlacement {
                tor: 0,
                nics: vec![Ipv4Addr::LOCALHOST],
            }],
        );
        c.timeout = Duration::from_secs(5);
        c
    }

    #[test]
    fn one_node_reduces_locally_for_every_op() {
        let job = u64::from(std::process::id()) << 20 | 0xc0;
        let size = 4;
        let handles: Vec<_> = (0..size)
            .map(|rank| {
                std::thread::spawn(move || {
                    let mut c = Communicator::new(single_node(rank, size, job)).unwrap();
                    let mut out = vec![];
                    for op in Op::ALL {
                        let dtype = Dtype::I32;
                        let send: Vec<u8> = (0..10i32)
                            .flat_map(|i| {
                                let v = (i + 1) * (rank as i32 + 1) - 3;
                                let mut e = v.to_ne_bytes().to_vec();
                                if op.carries_location() {
                                    e.extend_from_slice(&(rank as i32).to_ne_bytes());
                                }
                                e
                            })
                            .collect();
                        let mut recv = vec![0u8; send.len()];
                        let r = c.allreduce(&send, &mut recv, op, dtype).unwrap();
                        assert_eq!(r.path, Path::Local);
                        out.push((send, recv));
                    }
                    out
                })
            })
            .collect();
        let all: Vec<Vec<(Vec<u8>, Vec<u8>)>> =
            handles.into_iter().map(|h| h.join().unwrap()).collect();
        for (k, op) in Op::ALL.into_iter().enumerate() {
            let mut parts: Vec<Vec<u8>> = all.iter().map(|r| r[k].0.clone()).collect();
            for p in &mut parts {
                swap_order(op, Dtype::I32, p);
            }
            let mut expected = innet_common::reduce::reduce_all(op, Dtype::I32, &parts).unwrap();
            swap_order(op, Dtype::I32, &mut expected);
            for r in &all {
                assert_eq!(r[k].1, expected, "{op:?}");
            }
        }
    }

    #[test]
    fn bad_calls_are_named() {
        let job = u64::from(std::process::id()) << 20 | 0xc1;
        let mut c = Communicator::new(single_node(0, 1, job)).unwrap();
        assert!(matches!(
            c.allreduce(&[0; 8], &mut [0; 4], Op::Sum, Dtype::I32),
            Err(Error::Buffers { send: 8, recv: 4 })
        ));
        assert!(matches!(
            c.allreduce(&[0; 6], &mut [0; 6], Op::Sum, Dtype::I32),
            Err(Error::Partial { .. })
        ));
        assert!(matches!(
            c.allreduce(&[0; 8], &mut [0; 8], Op::Band, Dtype::F64),
            Err(Error::Reduce(ReduceError::Undefined(Op::Band, Dtype::F64)))
        ));
        let mut cfg = single_node(3, 2, job);
        cfg.rank = 3;
        assert!(matches!(
            Communicator::new(cfg),
            Err(Error::Layout(LayoutError::RankOutOfRange {
                rank: 3,
                size: 2
            }))
        ));
    }
}
