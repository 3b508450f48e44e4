//! Running MPI programs under `mpirun` (Debian's OpenMPI and MPICH) on a namespace fabric.
//!
//! Three launches ([`Launch`]):
//! - **multi-node** ([`MpiRun::multi_node`]), as users run MPI on a cluster: `mpirun` starts
//!   in node 0's namespace with node 0's hostname, and starts one daemon (OpenMPI's
//!   `orted`, MPICH's `hydra_pmi_proxy`) on every other node through `innet-node-agent`,
//!   its "ssh". Ranks of one node meet in shared memory, ranks of different nodes over TCP
//!   through the fabric's bridges. The baseline innet is measured against;
//! - **tcp-all-ranks** ([`MpiRun::over_fabric`]): one `mpirun` in the root namespace, each
//!   rank entering its node's namespace (`innet-netns-rank`), TCP between every pair of
//!   ranks, ranks of one node included;
//! - **root** (the default): every rank in the root namespace, MPI's own traffic through
//!   this machine's shared memory; the interposer opens its INC sockets in the rank's node
//!   namespace (see `innet-mpi`).
//!
//! Every run holds [`AutogroupOff`] (see [`autogroup`]).

pub mod autogroup;
pub mod nodes;
pub mod scratch;

use std::{
    ffi::OsString,
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use innet_client::Mode;
use innet_mpi::rank_report::Summary;

pub use self::{
    autogroup::AutogroupOff,
    nodes::{MapBy, Nodes},
    scratch::{Scratch, mpi_fabric},
};
use crate::topology::Topology;

/// One of Debian's MPI implementations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    OpenMpi,
    Mpich,
}

impl Flavour {
    pub const ALL: [Self; 2] = [Self::OpenMpi, Self::Mpich];

    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::OpenMpi => "openmpi",
            Self::Mpich => "mpich",
        }
    }

    /// The interposer built for this implementation.
    #[must_use]
    pub fn interposer(self) -> PathBuf {
        artifact(&format!("libinnet-mpi-{}.so", self.name()))
    }

    /// An MPI program of `innet-mpi/programs` built for this implementation.
    #[must_use]
    pub fn program(self, name: &str) -> PathBuf {
        artifact(&format!("{name}-{}", self.name()))
    }
}

/// `target/<profile>/mpi/<name>`, built by `cargo xtask build` / `cargo xtask test`.
fn artifact(name: &str) -> PathBuf {
    let p = crate::target_dir().join("mpi").join(name);
    assert!(
        p.exists(),
        "{} is missing: `cargo xtask test` (or `cargo xtask build`) builds the MPI interposers and programs",
        p.display()
    );
    p
}

/// mpi4py's test suite, fetched by `cargo xtask test`.
#[must_use]
pub fn mpi4py_tests() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/mpi4py-3.1.4/test");
    assert!(
        p.join("runtests.py").exists(),
        "{} is missing: `cargo xtask test` fetches mpi4py's test suite",
        p.display()
    );
    p
}

/// Writes the interposer's configuration for `topo` (`ranks_per_node` ranks per node, in
/// node order) into `dir`, and returns its path.
#[must_use]
pub fn write_config(topo: &Topology, mode: Mode, ranks_per_node: usize, dir: &Path) -> PathBuf {
    let config = PlacementFile::new(topo, mode, ranks_per_node, dir);
    config.write(true);
    config.path
}

/// The interposer's placement file (`INNET_MPI_CONFIG`), written when the command is built:
/// whether it names the nodes' namespaces depends on the launch.
#[derive(Clone, Debug)]
struct PlacementFile {
    path: PathBuf,
    mode: Mode,
    ranks_per_node: usize,
    /// Each node's TOR, INC address and namespace, in node order.
    nodes: Vec<(usize, std::net::Ipv4Addr, String)>,
}

impl PlacementFile {
    fn new(topo: &Topology, mode: Mode, ranks_per_node: usize, dir: &Path) -> Self {
        // A node's INC sockets open in its first socket's namespace (node mode: one leader
        // per node, on its first NIC).
        let nodes = topo
            .hosts
            .iter()
            .filter(|h| h.socket == 0)
            .map(|h| (h.tor, h.ip, h.ns.name.clone()))
            .collect();
        Self {
            path: dir.join("innet-mpi.toml"),
            mode,
            ranks_per_node,
            nodes,
        }
    }

    /// Writes the file; `netns`: name each node's namespace (ranks outside it open their
    /// sockets there).
    fn write(&self, netns: bool) {
        let mut text = format!(
            "mode = \"{}\"\nranks_per_node = {}\ntimeout_ms = 10000\n",
            self.mode, self.ranks_per_node
        );
        for (tor, ip, ns) in &self.nodes {
            let _ = write!(text, "\n[[node]]\ntor = {tor}\nnics = [\"{ip}\"]\n");
            if netns {
                let _ = writeln!(text, "netns = \"{ns}\"");
            }
        }
        std::fs::write(&self.path, text).expect("write the interposer's configuration");
    }
}

/// Where the ranks run and how MPI connects them.
pub enum Launch {
    /// Every rank in the root namespace (MPI's shared memory).
    Root,
    /// One `mpirun` in the root namespace, each rank in its node's namespace (the nodes'
    /// namespaces, ranks per node), TCP between every pair of ranks.
    TcpAllRanks(Vec<String>, usize),
    /// One daemon per node, shared memory within a node, TCP between nodes.
    MultiNode(Nodes),
}

impl Launch {
    /// The launch's name in the bench's rows.
    #[must_use]
    pub const fn name(&self) -> &'static str {
        match self {
            Self::Root => "root-shm",
            Self::TcpAllRanks(..) => "tcp-all-ranks",
            Self::MultiNode(_) => "multi-node",
        }
    }
}

/// One `mpirun`.
pub struct MpiRun {
    pub flavour: Flavour,
    pub ranks: usize,
    /// The program and its arguments.
    pub program: Vec<OsString>,
    /// Variables for the ranks (not for `mpirun` itself).
    pub env: Vec<(String, OsString)>,
    /// Longest the run may take, in seconds (then it is killed and fails).
    pub timeout_secs: u64,
    /// Whether the ranks preload innet's interposer.
    pub interpose: bool,
    pub launch: Launch,
    /// Whether the ranks get the placement file [`MpiRun::innet`] writes
    /// (`INNET_MPI_CONFIG`); off, the interposer finds its placement itself.
    pub placement_file: bool,
    config: Option<PlacementFile>,
}

/// The test fabrics' host subnet: MPI's TCP is confined to it.
pub const FABRIC_SUBNET: &str = "10.77.0.0/16";

/// How a node's OpenMPI ranks copy large messages to each other: `cma`
/// (`process_vm_readv`), which a node's ranks may use on each other here (root, one user
/// namespace); a machine that forbids it needs `none`.
pub const VADER_SINGLE_COPY: &str = "cma";

impl MpiRun {
    #[must_use]
    pub fn new(flavour: Flavour, ranks: usize, program: &[OsString]) -> Self {
        Self {
            flavour,
            ranks,
            program: program.to_vec(),
            env: vec![],
            timeout_secs: 300,
            interpose: true,
            launch: Launch::Root,
            placement_file: true,
            config: None,
        }
    }

    /// Served by innet: the ranks read the `inc-node` placement of `topo` (`ranks_per_node`
    /// per node, by slot), written into `dir` (unless [`MpiRun::placement_file`] is off),
    /// and write their reports into `reports`.
    #[must_use]
    pub fn innet(
        mut self,
        topo: &Topology,
        ranks_per_node: usize,
        dir: &Path,
        reports: &Path,
    ) -> Self {
        self.config = Some(PlacementFile::new(topo, Mode::IncNode, ranks_per_node, dir));
        self.env("INNET_MPI_REPORT", reports)
    }

    /// The tcp-all-ranks launch: every rank in its node's namespace (`ranks_per_node` per
    /// node, in node order), MPI's traffic over TCP through the fabric's bridges, between
    /// ranks of one node too.
    #[must_use]
    pub fn over_fabric(mut self, topo: &Topology, ranks_per_node: usize) -> Self {
        let netns = topo
            .hosts
            .iter()
            .filter(|h| h.socket == 0)
            .map(|h| h.ns.name.clone())
            .collect();
        self.launch = Launch::TcpAllRanks(netns, ranks_per_node);
        self
    }

    /// The multi-node launch over `nodes` (see [`Nodes`] for the placements).
    ///
    /// # Panics
    /// More ranks than the nodes have slots.
    #[must_use]
    pub fn multi_node(mut self, nodes: Nodes) -> Self {
        assert!(
            self.ranks <= nodes.slots(),
            "{} ranks on {} slots",
            self.ranks,
            nodes.slots()
        );
        self.launch = Launch::MultiNode(nodes);
        self
    }

    /// Plain MPI: the interposer is not loaded at all.
    #[must_use]
    pub fn without_interposer(mut self) -> Self {
        self.interpose = false;
        self
    }

    /// No `INNET_MPI_CONFIG`: the interposer discovers the placement.
    #[must_use]
    pub fn without_placement_file(mut self) -> Self {
        self.placement_file = false;
        self
    }

    #[must_use]
    pub fn env(mut self, key: &str, value: impl Into<OsString>) -> Self {
        self.env.push((key.to_owned(), value.into()));
        self
    }

    /// The launcher's settings that shape the measurement, as `key=value` words (what the
    /// bench's rows record).
    #[must_use]
    pub fn settings(&self) -> String {
        let mut words: Vec<String> = match self.flavour {
            Flavour::OpenMpi => self
                .openmpi_options()
                .iter()
                .map(|(k, v)| {
                    let k = k.trim_start_matches('-');
                    if v.is_empty() {
                        k.to_owned()
                    } else {
                        format!("{k}={v}")
                    }
                })
                .collect(),
            Flavour::Mpich => self.mpich_settings(),
        };
        if autogroup::current().is_some() {
            words.push("sched_autogroup_enabled=0".into());
        }
        words.join(" ")
    }

    /// OpenMPI's options for this launch: `--mca` parameters, and flags (`--…`, with a
    /// value unless it is empty).
    fn openmpi_options(&self) -> Vec<(&'static str, String)> {
        let mca = |k: &'static str, v: &str| (k, v.to_owned());
        match &self.launch {
            Launch::Root => vec![
                mca("btl", "self,vader"),
                mca("btl_vader_single_copy_mechanism", "none"),
                ("--oversubscribe", String::new()),
            ],
            // TCP between the nodes' addresses: the bridges carry every byte.
            Launch::TcpAllRanks(..) => vec![
                mca("pml", "ob1"),
                mca("btl", "self,tcp"),
                mca("btl_tcp_if_include", FABRIC_SUBNET),
                ("--oversubscribe", String::new()),
            ],
            Launch::MultiNode(nodes) => vec![
                // ob1 over the BTLs (Debian's OpenMPI would pick UCX where present).
                mca("pml", "ob1"),
                mca("btl", "self,vader,tcp"),
                mca("btl_tcp_if_include", FABRIC_SUBNET),
                // The daemons' own connections to mpirun, too.
                mca("oob_tcp_if_include", FABRIC_SUBNET),
                mca("btl_vader_single_copy_mechanism", VADER_SINGLE_COPY),
                // Ranks waiting in MPI give the CPU away, as on an oversubscribed node.
                mca("mpi_yield_when_idle", "1"),
                ("--bind-to", "none".into()),
                ("--map-by", nodes.map_by.name().into()),
            ],
        }
    }

    fn mpich_settings(&self) -> Vec<String> {
        match &self.launch {
            Launch::MultiNode(nodes) => vec![
                "launcher=ssh(innet-node-agent)".into(),
                format!("map-by={}", nodes.map_by.name()),
            ],
            _ => vec![],
        }
    }

    /// The command line, the interposer preloaded for the ranks (unless plain): `timeout`
    /// bounds it, and it ends with the calling thread
    /// ([`die_with_parent`](crate::die_with_parent)).
    #[must_use]
    pub fn command(&self) -> Command {
        let mut env = self.env.clone();
        if let Some(config) = self.config.as_ref().filter(|_| self.placement_file) {
            // Ranks of the multi-node launch already sit in their node's namespace.
            config.write(!matches!(self.launch, Launch::MultiNode(_)));
            env.push(("INNET_MPI_CONFIG".into(), config.path.clone().into()));
        }
        if self.interpose {
            env.push(("LD_PRELOAD".into(), self.flavour.interposer().into()));
        }
        let mut c = Command::new("timeout");
        // Callers wait for it on the thread that starts it; `timeout` passes the SIGTERM on.
        crate::die_with_parent(&mut c);
        c.args(["-k", "10", &self.timeout_secs.to_string()]);
        let agent = crate::target_dir().join("innet-node-agent");
        if let Launch::MultiNode(nodes) = &self.launch {
            // mpirun on node 0, as node 0, where the node names resolve.
            c.arg(&agent)
                .arg("--hosts")
                .arg(nodes.hosts_file())
                .args(["--no-shell", nodes.hostname(0)]);
        }
        match self.flavour {
            Flavour::OpenMpi => {
                c.args(["mpirun.openmpi", "--allow-run-as-root"]);
                if let Launch::MultiNode(nodes) = &self.launch {
                    c.arg("--hostfile").arg(nodes.hostfile());
                    c.args(["--mca", "plm_rsh_agent"]).arg(&agent);
                }
                for (k, v) in self.openmpi_options() {
                    if k.starts_with('-') {
                        c.arg(k);
                    } else {
                        c.args(["--mca", k]);
                    }
                    if !v.is_empty() {
                        c.arg(v);
                    }
                }
                c.args(["-np", &self.ranks.to_string()]);
                for (k, v) in &env {
                    let mut kv = OsString::from(format!("{k}="));
                    kv.push(v);
                    c.arg("-x").arg(kv);
                }
            }
            Flavour::Mpich => {
                c.arg("mpirun.mpich");
                if let Launch::MultiNode(nodes) = &self.launch {
                    c.args(["-launcher", "ssh", "-launcher-exec"]).arg(&agent);
                    c.arg("-f").arg(nodes.machinefile());
                }
                c.args(["-np", &self.ranks.to_string()]);
                for (k, v) in &env {
                    c.args(["-genv", k]).arg(v);
                }
            }
        }
        if let Launch::TcpAllRanks(netns, ppn) = &self.launch {
            c.arg(crate::target_dir().join("innet-netns-rank"))
                .arg(format!("--netns={}", netns.join(",")))
                .arg(format!("--ppn={ppn}"))
                .arg("--");
        }
        c.args(&self.program);
        c
    }

    /// Starts it with its output captured (for `wait_with_output`), while the caller does
    /// something else.
    ///
    /// # Panics
    /// mpirun could not be spawned.
    #[must_use]
    pub fn spawn_captured(&self) -> std::process::Child {
        self.command()
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn mpirun")
    }

    /// Runs it to the end with the scheduler's autogroups off.
    ///
    /// # Errors
    /// mpirun could not be spawned.
    pub fn output(&self) -> std::io::Result<Output> {
        let _autogroups = AutogroupOff::new();
        self.command().output()
    }

    /// Runs it; panics (with the output) unless it exits 0.
    #[must_use]
    pub fn run(&self) -> Output {
        let _autogroups = AutogroupOff::new();
        crate::run(&mut self.command())
    }
}

/// Every rank's report in `dir`, by rank; panics unless there are `ranks` of them.
#[must_use]
pub fn reports(dir: &Path, ranks: usize) -> Vec<Summary> {
    let mut all: Vec<Summary> = (0..ranks)
        .map(|r| {
            crate::read_json(&dir.join(format!("rank-{r}.json")), "innet-mpi report")
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    all.sort_by_key(|r| r.rank);
    all
}
