//! A communicator's group over its life: joining (the node-local channel, the leader's
//! INC socket, the NIC tree or DPU, the control-plane handshake), setting the group up again
//! after the network lost it, and freeing it when the communicator goes.

use std::{
    io,
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use innet_common::{
    capabilities::Capabilities,
    fail::{FAIL_GROUP_LOST, FAIL_HANDSHAKE},
    proto::{DEFAULT_PAYLOAD_BYTES, payload_for_mtu},
    wire::ControlPayload,
};
use tracing::{info, warn};

use innet_net::nic::dpu::DpuRequest;

use crate::{
    dpu,
    endpoint::{Batching, Endpoint, Notice},
    frames::{self, MASK24},
    handshake::{GroupParams, HandshakeError, Leader, Offer, group_id, params, setup_key},
    local::LocalChannel,
    nic::{NicPort, Tree},
    roles::{Grouping, LayoutError, RolePlan, check_tors},
    shm::NodeSegment,
    stages::StageLog,
    tree::Weigh,
};

use super::{Config, Core, Error, Losses, Mode, config::grouping_for, explain_fail_cause};

/// The shortest first retry of a regroup's control packets inside a call.
const REGROUP_RETRY: Duration = Duration::from_millis(10);

/// A group lost within this many collectives of being set up was lost quickly. After two
/// quick losses in a row the leaders run this many collectives on the hosts before they
/// set the group up again, twice as many after each further quick loss (up to 1024×):
/// a network that keeps losing groups costs a few collectives, not every one.
pub const QUICK_LOSS_CALLS: u32 = 64;

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

impl Core {
    /// The handle's [`Communicator::new`](crate::Communicator::new): joins the communicator.
    pub fn new(cfg: Config) -> Result<Self, Error> {
        let layout = cfg.layout;
        check_placement(&cfg)?;
        let tor_of: Vec<usize> = cfg.nodes.iter().map(|n| n.tor).collect();
        check_tors(&tor_of)?;
        let grouping = grouping_for(&cfg);
        let plan = RolePlan::new(layout, grouping)?;
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
            scatter: vec![],
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
            Batching {
                gso: self.cfg.gso,
                gro: self.cfg.gro,
            },
        )?;
        if self.cfg.mode == Mode::IncDpu {
            self.join_dpu(&ep, &ips, degree)?;
        }
        if in_network {
            let group = self.handshake(&ep, (comm, 0), None).unwrap_or_else(|e| {
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
                ep.set_tree_parent(None);
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
                // The member's results come from its DPU, and from nowhere else.
                ep.set_tree_parent(Some(member.address()));
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
        (comm, generation): (u32, u32),
        during_call: Option<Instant>,
    ) -> Result<GroupParams, HandshakeError> {
        let plan = &self.plan;
        let me = self.leader;
        let aside = |d: &[u8], from| ep.take_stray(d, from);
        let side = self.handshake_side(ep);
        // Inside a collective the set-up shares the call's bound: the call still ends in
        // time, on the hosts if the set-up did not finish.
        // A regroup inside a call retries a lost control packet soon (the set-up of a
        // running job is a handful of packets, not a storm of first queries).
        let hs = Leader {
            key: setup_key(self.cfg.job, generation),
            aside: during_call.map(|_| &aside as _),
            timeout: during_call.map_or(side.timeout, |d| {
                side.timeout
                    .min(d.saturating_duration_since(Instant::now()))
            }),
            retry: during_call.map_or(side.retry, |_| {
                self.cfg.retry.clamp(REGROUP_RETRY, side.retry)
            }),
            ..side
        };
        let leaders = plan.leaders() as u16;
        if !plan.is_mrr(me) {
            return hs.join(ep.ip_of(plan.query_target(me)), comm, leaders);
        }
        let told = self.told_ips(ep);
        let heard = hs.collect(&told, comm)?;
        let base = if me == 0 {
            hs.decide(&heard, comm, leaders, None)
        } else {
            hs.sync(ep.ip_of(0), comm, leaders, &heard)?
        };
        // Socket mode's MRRs each choose the paths of their own NMRRs: alike only by address.
        let weigh = if plan.grouping == Grouping::Socket {
            Weigh::ByAddress
        } else {
            Weigh::ByLoad
        };
        let notices = hs.address(&base, &heard, &told, weigh);
        hs.notify(&notices)?;
        let group = params(comm, notices.first().map_or(&base, |(_, n)| n));
        ep.remember_notices(notices);
        Ok(group)
    }

    /// This leader's end of the control plane, on its INC socket.
    fn handshake_side<'a>(&self, ep: &'a Endpoint) -> Leader<'a> {
        Leader {
            sock: &*ep.sock,
            ip: ep.ip(),
            rank: self.cfg.rank as u32,
            timeout: self.cfg.timeout,
            retry: self.cfg.retry.max(Duration::from_millis(100)),
            offer: self.offer,
            payload: link_payload(ep.ip(), self.cfg.max_packet_bytes),
            aside: None,
            // A kill needs none (the switches check its port); a set-up sets its own.
            key: 0,
        }
    }

    /// Before collective `seq`, sets the group up again as notice `n` says (a new id, so
    /// nothing left of the old one on some switch mixes in) — or, after quick losses in a
    /// row, leaves the network alone for a while (every leader decides the same from the
    /// same collective numbers); a NIC tree is not built again. The MRR first frees what
    /// is left of the old group. The set-up ends by the call's `deadline`. Returns the new
    /// group's `fail_cause`.
    pub(super) fn regroup(&mut self, n: Notice, seq: u32, deadline: Instant) -> u8 {
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
                .handshake(&ep, (comm, n.generation), Some(deadline))
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
    pub(super) fn kill_group(&self, ep: &Endpoint, comm: u32) {
        let me = self.leader;
        if !self.plan.is_mrr(me) {
            return;
        }
        let mut notices = ep.notices_of(comm);
        if notices.is_empty() {
            // No notify of this group remembered: kill along the bridge.
            let mut k = ControlPayload::default();
            k.set_true_comm_id(comm);
            notices = self.told_ips(ep).into_iter().map(|ip| (ip, k)).collect();
        }
        if let Err(e) = self.handshake_side(ep).kill(&notices) {
            warn!(error = %e, "sending the kill failed: the switches' idle collection frees the group");
        }
    }

    /// MRR: the addresses of the leaders it notifies (and kills the group for).
    pub(super) fn told_ips(&self, ep: &Endpoint) -> Vec<Ipv4Addr> {
        let told = self.plan.told_by(self.leader).into_iter();
        told.map(|i| ep.ip_of(i)).collect()
    }
}

/// The largest payload the link holding `ip` carries (its MTU's), at most `max`; the
/// 1500 B MTU's when the link cannot be read.
fn link_payload(ip: Ipv4Addr, max: usize) -> u16 {
    let mtu = innet_net::netdev::ifname_of(ip).and_then(|i| innet_net::netdev::mtu(&i).ok());
    let payload = mtu.map_or(DEFAULT_PAYLOAD_BYTES, payload_for_mtu);
    u16::try_from(payload.min(max)).unwrap_or(u16::MAX)
}

impl Drop for Core {
    /// Leaders wait (up to the timeout) until every leader is done, answering late
    /// requests meanwhile; then the MRRs free the group on the switches.
    fn drop(&mut self) {
        let Some(mut ep) = self.endpoint.take() else {
            return;
        };
        let start = Instant::now();
        ep.close(self.seq, start + self.cfg.timeout);
        tracing::debug!(took = ?start.elapsed(), "the other leaders said goodbye");
        // Every leader is done: this host's part of a NIC tree can go.
        if self.nic.take().is_some() || self.dpu.take().is_some() {
            return;
        }
        if let Some(g) = self.group.filter(GroupParams::in_network) {
            self.kill_group(&ep, g.true_comm_id);
        }
    }
}

/// The rank lies in the layout, and the layout's nodes are the ones placed.
fn check_placement(cfg: &Config) -> Result<(), LayoutError> {
    let layout = cfg.layout;
    if cfg.rank >= layout.size {
        return Err(LayoutError::RankOutOfRange {
            rank: cfg.rank,
            size: layout.size,
        });
    }
    if cfg.nodes.len() != layout.nodes() {
        return Err(LayoutError::Placement {
            given: cfg.nodes.len(),
            nodes: layout.nodes(),
        });
    }
    Ok(())
}
