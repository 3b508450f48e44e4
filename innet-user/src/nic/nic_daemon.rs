//! `innet daemon --role nic`: owns a host's NICs. It attaches `innet_nic` to them and serves
//! the host's clients on the abstract socket [`ipc::SOCKET_NAME`]: it installs a client's
//! member of a reduction tree (parent and children from the member list and the degree,
//! the parent's MAC by ARP), names the port to post into ([`post_port`]) and hands over the
//! completion map, and frees the group on request or when the client's connection closes.

use std::{
    future::Future,
    net::Ipv4Addr,
    os::fd::{AsFd as _, AsRawFd as _, OwnedFd},
    sync::{Arc, Mutex},
    time::Duration,
};

use aya::maps::{Array, MapData};
use innet_common::{
    capabilities::Capabilities,
    fail::{FAIL_CAPACITY, FAIL_NO_NIC},
    maps::{DAEMON_STATS, NIC_COMPLETIONS},
    proto::STANDARD_MTU,
    stats::DaemonStats,
};
use innet_net::{
    netdev,
    nic::{
        ipc::{self, Reply, Request},
        tree::{Tree, result_address},
    },
};
use tokio::io::Interest;
use tracing::{debug, info, warn};

use crate::{
    error::{Error, Result},
    group_maps::{GroupMaps, NicGroupSpec},
    loader::{self, AttachOptions},
    nic::{membership::Memberships, post_port},
    pins::PinLayout,
};

/// How a NIC daemon runs.
#[derive(Clone, Debug)]
pub struct NicDaemonOptions {
    pub pins: PinLayout,
    /// The host's NIC ports (or SmartNIC representors) to run on.
    pub ifaces: Vec<String>,
    pub attach: AttachOptions,
    /// Leave programs and maps pinned and attached on exit.
    pub keep_state: bool,
    pub capabilities: Capabilities,
}

/// How long the daemon waits for ARP to find a parent's MAC.
const ARP_TIMEOUT: Duration = Duration::from_secs(2);

struct State {
    groups: GroupMaps,
    /// The result addresses of this host's members below a root.
    memberships: Memberships,
    stats: DaemonStats,
    published: Array<MapData, DaemonStats>,
}

impl State {
    fn publish(&mut self) {
        if let Err(e) = self.published.set(0, self.stats, 0) {
            warn!(error = %e, "publishing the daemon counters failed");
        }
    }
}

/// What every connection hands out.
struct Shared {
    opts: NicDaemonOptions,
    /// Where hosts post their contributions ([`post_port::POST_HOST`]).
    post_ifindex: u32,
    completions: OwnedFd,
    completion_entries: u32,
    state: Mutex<State>,
}

/// Runs until `shutdown` completes.
///
/// # Errors
/// Attach failures, missing pins, or another NIC daemon in this network namespace.
pub async fn run(opts: NicDaemonOptions, shutdown: impl Future<Output = ()>) -> Result<()> {
    netdev::require_root("innet daemon --role nic")?;
    loader::attach_missing(&opts.pins, &opts.ifaces, opts.attach, loader::attach_nic)?;
    let completions =
        MapData::from_pin(opts.pins.map(NIC_COMPLETIONS)).map_err(|e| Error::OpenPinned {
            what: "map",
            path: opts.pins.map(NIC_COMPLETIONS),
            source: Box::new(e),
        })?;
    let completion_entries = completions
        .info()
        .map(|i| i.max_entries())
        .map_err(|source| Error::Map {
            name: NIC_COMPLETIONS,
            source,
        })?;
    let io_err = |what: &str| Error::io(what.to_owned());
    let completions = completions
        .fd()
        .as_fd()
        .try_clone_to_owned()
        .map_err(io_err("NIC_COMPLETIONS fd"))?;
    let largest_mtu = opts
        .ifaces
        .iter()
        .map(|i| netdev::mtu(i))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .max()
        .unwrap_or(STANDARD_MTU);
    let post_ifindex = post_port::ensure(&opts.pins, opts.attach, largest_mtu)?;
    let published: Array<MapData, DaemonStats> = opts.pins.open_typed(DAEMON_STATS)?;
    let stats = published.get(&0, 0).unwrap_or_default();
    let listener = std::os::unix::net::UnixListener::bind_addr(
        &ipc::address().map_err(io_err("socket name"))?,
    )
    .map_err(|e| Error::Io {
        path: format!(
            "abstract socket @{}: {e} (does another NIC daemon run in this network namespace?)",
            ipc::SOCKET_NAME
        )
        .into(),
        source: e,
    })?;
    listener.set_nonblocking(true).map_err(io_err("listener"))?;
    let listener = tokio::net::UnixListener::from_std(listener).map_err(io_err("listener"))?;
    let groups = GroupMaps::open(&opts.pins)?;
    let opts = NicDaemonOptions {
        capabilities: opts.capabilities.with_window(groups.window()),
        ..opts
    };
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            groups,
            memberships: Memberships::default(),
            stats,
            published,
        }),
        opts,
        post_ifindex,
        completions,
        completion_entries,
    });
    info!(ports = ?shared.opts.ifaces, socket = ipc::SOCKET_NAME, "NIC daemon running");
    tokio::pin!(shutdown);
    let result = loop {
        tokio::select! {
            () = &mut shutdown => break Ok(()),
            conn = listener.accept() => match conn {
                Ok((conn, _)) => {
                    tokio::spawn(serve(conn, shared.clone()));
                }
                Err(e) => warn!(error = %e, "accepting a client failed"),
            },
        }
    };
    if shared.opts.keep_state {
        info!("exiting; programs, maps and groups stay pinned (--keep-state)");
    } else {
        let ports = loader::detach_all(&shared.opts.pins, false)?;
        info!(?ports, "exiting; detached and unpinned");
    }
    result
}

/// One client: its requests in order; its groups freed when it goes.
async fn serve(conn: tokio::net::UnixStream, shared: Arc<Shared>) {
    let fd = conn.as_raw_fd();
    let mut pending = vec![];
    let mut owned: Vec<u32> = vec![];
    loop {
        if conn.readable().await.is_err() {
            break;
        }
        let line = match conn.try_io(Interest::READABLE, || ipc::recv(fd, &mut pending)) {
            Ok(Some((line, _))) => line,
            Ok(None) => break,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                debug!(error = %e, "client connection failed");
                break;
            }
        };
        let reply = match serde_json::from_slice::<Request>(&line) {
            Ok(req) => {
                let wire_id = req.wire_id();
                let (shared, owns) = (shared.clone(), owned.clone());
                let reply = tokio::task::spawn_blocking(move || handle(&shared, req, &owns))
                    .await
                    .unwrap_or_else(|e| refuse(FAIL_NO_NIC, format!("daemon task failed: {e}")));
                match reply {
                    Reply::Installed { .. } => owned.push(wire_id),
                    Reply::Removed => owned.retain(|w| *w != wire_id),
                    Reply::Refused { .. } => {}
                }
                reply
            }
            Err(e) => refuse(FAIL_NO_NIC, format!("unreadable request: {e}")),
        };
        // The descriptors go with an install.
        let fds: Vec<i32> = if matches!(reply, Reply::Installed { .. }) {
            vec![shared.completions.as_raw_fd()]
        } else {
            vec![]
        };
        if conn.writable().await.is_err()
            || conn
                .try_io(Interest::WRITABLE, || ipc::send(fd, &reply, &fds))
                .is_err()
        {
            break;
        }
    }
    // A client that left without removing its groups: free them now.
    let mut state = shared.state.lock().expect("state");
    for wire_id in owned {
        state.memberships.leave(wire_id);
        if state.groups.remove(wire_id).is_ok() {
            info!(wire_id, "client gone: group freed");
            state.stats.groups_collected += 1;
        }
    }
    state.publish();
}

fn refuse(fail_cause: u8, error: String) -> Reply {
    Reply::Refused { fail_cause, error }
}

/// Carries out one request.
fn handle(shared: &Shared, req: Request, owned: &[u32]) -> Reply {
    match req {
        Request::Install {
            wire_id,
            members,
            degree,
            me,
        } => install(shared, wire_id, &members, degree, me).unwrap_or_else(|refused| refused),
        Request::Remove { wire_id } => {
            if !owned.contains(&wire_id) {
                return refuse(FAIL_NO_NIC, format!("group {wire_id:#x} is not yours"));
            }
            let mut state = shared.state.lock().expect("state");
            state.memberships.leave(wire_id);
            let reply = match state.groups.remove(wire_id) {
                Ok(()) => {
                    state.stats.groups_killed += 1;
                    Reply::Removed
                }
                Err(e) => refuse(FAIL_NO_NIC, e.to_string()),
            };
            state.publish();
            reply
        }
    }
}

fn install(
    shared: &Shared,
    wire_id: u32,
    members: &[Ipv4Addr],
    degree: usize,
    me: usize,
) -> Result<Reply, Reply> {
    let tree = Tree::new(members.len(), degree)
        .and_then(|t| t.check_member(me).map(|()| t))
        .map_err(|e| refuse(FAIL_NO_NIC, e.to_string()))?;
    let own_ip = members[me];
    let ifname = shared
        .opts
        .ifaces
        .iter()
        .find(|i| netdev::ipv4_addresses(i).contains(&own_ip))
        .ok_or_else(|| {
            refuse(
                FAIL_NO_NIC,
                format!(
                    "{own_ip} is on none of this daemon's NICs ({})",
                    shared.opts.ifaces.join(", ")
                ),
            )
        })?;
    let fail = |e: netdev::NetdevError| refuse(FAIL_NO_NIC, e.to_string());
    let ifindex = netdev::ifindex(ifname).map_err(fail)?;
    let own_mac = netdev::mac(ifname).map_err(fail)?;
    let parent = match tree.parent(me) {
        None => None,
        Some(p) => {
            let ip = members[p];
            let mac = netdev::neighbour_mac(ip, ifname, ARP_TIMEOUT).ok_or_else(|| {
                refuse(
                    FAIL_NO_NIC,
                    format!("no ARP answer from the parent {ip} on {ifname}"),
                )
            })?;
            Some((ip, mac))
        }
    };
    let spec = NicGroupSpec {
        id: wire_id,
        ifindex,
        own_mac,
        own_ip,
        own_rank: me as u32,
        parent,
        root: members[0],
        result: result_address(wire_id),
        children: tree.children(me).map(|c| (members[c], c as u32)).collect(),
        dpu: None,
    };
    let mut state = shared.state.lock().expect("state");
    // Results come by multicast to every member below the root: join before any flows.
    if me != 0
        && let Err(e) = state.memberships.join(wire_id, ifindex)
    {
        return Err(refuse(FAIL_NO_NIC, e.to_string()));
    }
    let installed = state.groups.install_nic(&spec);
    let reply = match installed {
        Ok(index) => {
            state.stats.groups_installed += 1;
            info!(wire_id, me, degree, ifname, index, "NIC group installed");
            let caps = shared.opts.capabilities;
            Ok(Reply::Installed {
                index,
                ifindex: shared.post_ifindex,
                completion_entries: shared.completion_entries,
                ops: caps.ops,
                dtypes: caps.dtypes,
                max_data_size: caps.max_data_size,
                window: caps.window,
            })
        }
        Err(e @ Error::CapacityFull { .. }) => {
            state.memberships.leave(wire_id);
            state.stats.refused_capacity += 1;
            Err(refuse(FAIL_CAPACITY, e.to_string()))
        }
        Err(e) => {
            state.memberships.leave(wire_id);
            Err(refuse(FAIL_NO_NIC, e.to_string()))
        }
    };
    state.publish();
    reply
}
