//! Joining a communicator from what the job's launcher already provides — each rank's
//! number and an allgather (MPI's, a PMIx or TCP store's, [`Threads`] in one process) —
//! instead of a placement built by hand, as UCC's out-of-band collectives do.
//!
//! Two allgathers find the placement, the way the MPI interposer does at `MPI_Init`:
//! 1. each rank's node name (default: the host name; ranks with the same name share a
//!    node, its lowest rank speaks for it) and the node's INC address ([`address`]);
//! 2. in the switch modes, each node's TOR, which the switch names itself when the node
//!    probes towards another node ([`tor_of`]).
//!
//! The nodes are ordered TOR by TOR and the ranks renumbered node by node: a
//! communicator's [`rank`](crate::Communicator::rank) may differ from the launcher's (the
//! results do not depend on it).

use std::{error::Error as StdError, net::Ipv4Addr};

use tracing::{info, warn};

use crate::{Communicator, Config, Error, Layout, Mode};

pub mod address;
mod placement;
mod threads;

pub use crate::probe::tor_of;
pub use placement::{BootstrapError, Nodes};
pub use threads::Threads;

use placement::{Member, nodes_of, rank_order};

/// What a communicator asks of the job's launcher: this rank's number and an allgather
/// among the job's ranks. Blocking, and collective: every rank calls
/// [`allgather`](Self::allgather) the same number of times, in the same order.
pub trait Bootstrap {
    /// This rank, `0..size()`.
    fn rank(&self) -> usize;
    /// Ranks in the job.
    fn size(&self) -> usize;
    /// Every rank's `mine`, in rank order (this rank's too). Ranks' buffers may differ in
    /// length.
    ///
    /// # Errors
    /// Whatever the launcher's transport reports; the communicator is then not made.
    fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, Box<dyn StdError + Send + Sync>>;
}

/// How [`Config::discover`] finds this rank's place; the defaults suit one rank per
/// process on hosts with one fabric interface.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Discovery {
    /// The communicator's mode (the switch modes also probe for each node's TOR).
    pub mode: Mode,
    /// This rank's node (default: the host name). Ranks on one node meet in its shared
    /// memory, so they must see one filesystem.
    pub node: Option<String>,
    /// The node's INC address (default: [`address::node_address`] over `iface`).
    pub address: Option<Ipv4Addr>,
    /// The interface whose IPv4 address is the node's INC address.
    pub iface: Option<String>,
}

impl Discovery {
    #[must_use]
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            ..Self::default()
        }
    }
}

/// The nodes of `boot`'s job and each rank's node, found as this module's head says (two
/// allgathers; every rank must call it): what [`Config::discover`] places a communicator
/// on, and what the MPI interposer places every communicator of a job on at `MPI_Init`.
/// Nodes may hold different numbers of ranks here.
///
/// # Errors
/// The launcher's allgather failed, or the nodes cannot be served (a node without an
/// address among several, two with one address, TORs answering for some nodes only): the
/// same error on every rank.
pub fn find_nodes<B: Bootstrap + ?Sized>(
    boot: &B,
    how: &Discovery,
) -> Result<Nodes, BootstrapError> {
    let me = boot.rank();
    let node = how.node.clone().unwrap_or_else(host_name);
    let ip = how
        .address
        .map_or_else(|| address::node_address(how.iface.as_deref()), Ok);
    if let Err(e) = &ip {
        warn!(rank = me, "no INC address: {e}");
    }
    let mine = Member {
        node: node_key(node.as_bytes()),
        ip: ip.map_or(0, u32::from),
        tor: 0,
    };
    let mut members = gather(boot, &mine.first_round(), Member::from_first)?;
    let leader = members.iter().position(|m| m.node == mine.node);
    let several = members.iter().any(|m| m.node != mine.node);
    if several && how.mode.uses_switches() {
        let own = Ipv4Addr::from(mine.ip);
        let peer = members
            .iter()
            .map(|m| Ipv4Addr::from(m.ip))
            .find(|p| *p != own && !p.is_unspecified());
        let tor = match peer.filter(|_| leader == Some(me) && mine.ip != 0) {
            Some(peer) => probed_tor(own, peer),
            None => 0,
        };
        let tors = gather(boot, &tor.to_le_bytes(), |b| {
            Some(u32::from_le_bytes(b.try_into().ok()?))
        })?;
        for (m, tor) in members.iter_mut().zip(tors) {
            m.tor = tor;
        }
    }
    let nodes = nodes_of(&members)?;
    if me == 0 {
        info!(
            nodes = nodes.nodes.len(),
            size = boot.size(),
            "innet found the placement"
        );
    }
    Ok(nodes)
}

impl Config {
    /// The configuration of this rank of `boot`'s job, its placement found through `boot`
    /// ([`find_nodes`]); the defaults of [`Config::new`] otherwise, for the caller to
    /// adjust. Every rank must call it with the same `job`.
    ///
    /// # Errors
    /// The launcher's allgather failed, or the placement cannot serve the job (a node
    /// without an address, ranks spread unevenly over the nodes …): the same error on
    /// every rank.
    pub fn discover<B: Bootstrap + ?Sized>(
        job: u64,
        boot: &B,
        how: &Discovery,
    ) -> Result<Self, Error> {
        let size = boot.size();
        let found = find_nodes(boot, how)?;
        let rank_of = rank_order(&found)?;
        let layout = Layout::new(size, size / found.nodes.len(), 1)?;
        let mut cfg = Self::new(job, rank_of[boot.rank()], layout, found.nodes);
        cfg.mode = how.mode;
        Ok(cfg)
    }
}

impl Communicator {
    /// Joins the communicator of `boot`'s job: [`Config::discover`], then
    /// [`Communicator::new`].
    ///
    /// ```no_run
    /// use innet_client::{Communicator, Discovery, Op, bootstrap::Threads};
    /// # fn main() -> Result<(), innet_client::Error> {
    /// // Four ranks as threads of one process; an MPI program would wrap MPI_Allgather.
    /// let ranks = Threads::group(4).into_iter().map(|boot| {
    ///     std::thread::spawn(move || -> Result<f64, innet_client::Error> {
    ///         let mut comm = Communicator::bootstrap(7, &boot, &Discovery::default())?;
    ///         let mut sum = [0.0];
    ///         comm.allreduce(&[1.5], &mut sum, Op::Sum)?;
    ///         Ok(sum[0])
    ///     })
    /// });
    /// for r in ranks.collect::<Vec<_>>() {
    ///     assert_eq!(r.join().unwrap()?, 6.0);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Those of [`Config::discover`] and [`Communicator::new`].
    pub fn bootstrap<B: Bootstrap + ?Sized>(
        job: u64,
        boot: &B,
        how: &Discovery,
    ) -> Result<Self, Error> {
        Self::new(Config::discover(job, boot, how)?)
    }
}

/// One allgather, each rank's bytes decoded by `decode`.
fn gather<B: Bootstrap + ?Sized, T>(
    boot: &B,
    mine: &[u8],
    decode: impl Fn(&[u8]) -> Option<T>,
) -> Result<Vec<T>, BootstrapError> {
    let all = boot.allgather(mine).map_err(BootstrapError::Gather)?;
    if all.len() != boot.size() {
        return Err(BootstrapError::Count {
            got: all.len(),
            size: boot.size(),
        });
    }
    all.iter()
        .enumerate()
        .map(|(rank, b)| decode(b).ok_or(BootstrapError::Malformed { rank }))
        .collect()
}

/// The node's TOR as its probe from `own` towards `peer` (a leader under another TOR)
/// found it, as a placement record holds it: 0 when none answered, which is logged with the
/// reason (also what the MPI interposer records).
#[must_use]
pub fn probed_tor(own: Ipv4Addr, peer: Ipv4Addr) -> u32 {
    match tor_of(own, peer) {
        Ok(Some(tor)) => {
            info!(%tor, "the node's TOR answered its probe");
            u32::from(tor)
        }
        Ok(None) => {
            warn!(%own, %peer, "no innet TOR answered the probe");
            0
        }
        Err(e) => {
            warn!(%own, error = %e, "probing for the TOR failed");
            0
        }
    }
}

/// A node's key: the FNV-1a hash of its name.
#[must_use]
pub fn node_key(name: &[u8]) -> u64 {
    name.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// This host's name (empty when it has none).
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into `buf`.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return String::new();
    }
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

#[cfg(test)]
mod tests {
    use std::thread;

    use super::*;
    use crate::{Op, Path};

    /// Runs `f` on a rank thread per handle of an in-process group.
    fn on_threads<T: Send + 'static>(
        size: usize,
        f: impl Fn(Threads) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let f = std::sync::Arc::new(f);
        let handles: Vec<_> = Threads::group(size)
            .into_iter()
            .map(|boot| {
                let f = std::sync::Arc::clone(&f);
                thread::spawn(move || f(boot))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn threads_of_one_host_bootstrap_one_node_and_reduce() {
        let job = u64::from(std::process::id()) << 20 | 0xb0;
        let out = on_threads(4, move |boot| {
            let mut comm = Communicator::bootstrap(job, &boot, &Discovery::default()).unwrap();
            let mut sum = [0i64; 2];
            let mine = [boot.rank() as i64, 10];
            let report = comm.allreduce(&mine, &mut sum, Op::Sum).unwrap();
            (boot.rank(), comm.rank(), comm.size(), report.path, sum)
        });
        for (rank, comm_rank, size, path, sum) in out {
            assert_eq!(
                (comm_rank, size),
                (rank, 4),
                "one node keeps the launcher's order"
            );
            assert_eq!(path, Path::Local);
            assert_eq!(sum, [6, 40]);
        }
    }

    #[test]
    fn every_rank_learns_why_the_job_cannot_be_placed() {
        let out = on_threads(3, |boot| {
            let how = Discovery {
                mode: Mode::HostRd,
                node: Some(["a", "a", "b"][boot.rank()].into()),
                address: Some(Ipv4Addr::new(10, 0, 0, 1 + (boot.rank() / 2) as u8)),
                ..Discovery::default()
            };
            Config::discover(1, &boot, &how).map(|_| ())
        });
        for e in out {
            let e = e.unwrap_err();
            assert!(
                matches!(&e, Error::Bootstrap(BootstrapError::Uneven { counts }) if counts == &[2, 1]),
                "{e}"
            );
        }
    }

    #[test]
    fn discovery_places_nodes_and_renumbers_ranks_node_by_node() {
        // Launcher ranks alternate between two nodes; the host modes probe no TOR.
        let out = on_threads(4, |boot| {
            let how = Discovery {
                mode: Mode::HostRing,
                node: Some(format!("node{}", boot.rank() % 2)),
                address: Some(Ipv4Addr::new(10, 0, 0, 1 + (boot.rank() % 2) as u8)),
                ..Discovery::default()
            };
            Config::discover(9, &boot, &how).unwrap()
        });
        let ranks: Vec<usize> = out.iter().map(|c| c.rank).collect();
        assert_eq!(ranks, [0, 2, 1, 3]);
        for cfg in &out {
            assert_eq!((cfg.job, cfg.mode), (9, Mode::HostRing));
            assert_eq!(cfg.layout, Layout::new(4, 2, 1).unwrap());
            let nics: Vec<Ipv4Addr> = cfg.nodes.iter().map(|n| n.nics[0]).collect();
            assert_eq!(
                nics,
                [Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2)]
            );
        }
    }
}
