//! Running MPI programs under `mpirun` (Debian's OpenMPI and MPICH) on a namespace fabric.
//!
//! Two placements: by default each rank stays in the root namespace, where MPI's own
//! traffic flows through this machine's shared memory, and the interposer opens its INC
//! sockets in the rank's node namespace (see `innet-mpi`). [`MpiRun::over_fabric`] puts each
//! rank into its node's namespace (`innet-netns-rank`), so MPI's own TCP crosses the same
//! bridges innet runs on: the baseline a user of a real cluster compares with.

use std::{
    ffi::OsString,
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use innet_client::Mode;
use innet_mpi::report::Summary;

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
    let mut text =
        format!("mode = \"{mode}\"\nranks_per_node = {ranks_per_node}\ntimeout_ms = 10000\n");
    // A node's INC sockets open in its first socket's namespace (node mode: one leader
    // per node, on its first NIC).
    for h in topo.hosts.iter().filter(|h| h.socket == 0) {
        let _ = write!(
            text,
            "\n[[node]]\ntor = {}\nnics = [\"{}\"]\nnetns = \"{}\"\n",
            h.tor, h.ip, h.ns.name
        );
    }
    let path = dir.join("innet-mpi.toml");
    std::fs::write(&path, text).expect("write the interposer's configuration");
    path
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
    /// Each rank in its node's namespace (the nodes' namespaces, ranks per node), MPI over
    /// TCP through the fabric; `None`: every rank in the root namespace.
    pub fabric: Option<(Vec<String>, usize)>,
}

/// The test fabrics' host subnet: MPI's TCP is confined to it.
pub const FABRIC_SUBNET: &str = "10.77.0.0/16";

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
            fabric: None,
        }
    }

    /// Served by innet: the ranks read the `inc-node` placement of `topo` (`ranks_per_node`
    /// per node), written into `dir`, and write their reports into `reports`.
    #[must_use]
    pub fn innet(self, topo: &Topology, ranks_per_node: usize, dir: &Path, reports: &Path) -> Self {
        let config = write_config(topo, Mode::IncNode, ranks_per_node, dir);
        self.env("INNET_MPI_CONFIG", config)
            .env("INNET_MPI_REPORT", reports)
    }

    /// Every rank in its node's namespace (`ranks_per_node` per node, in node order), MPI's
    /// traffic over TCP through the fabric's bridges rather than shared memory.
    #[must_use]
    pub fn over_fabric(mut self, topo: &Topology, ranks_per_node: usize) -> Self {
        let netns = topo
            .hosts
            .iter()
            .filter(|h| h.socket == 0)
            .map(|h| h.ns.name.clone())
            .collect();
        self.fabric = Some((netns, ranks_per_node));
        self
    }

    /// Plain MPI: the interposer is not loaded at all.
    #[must_use]
    pub fn without_interposer(mut self) -> Self {
        self.interpose = false;
        self
    }

    #[must_use]
    pub fn env(mut self, key: &str, value: impl Into<OsString>) -> Self {
        self.env.push((key.to_owned(), value.into()));
        self
    }

    /// The command line, the interposer preloaded for the ranks (unless plain): `timeout` bounds it;
    /// OpenMPI runs as root with its shared-memory transport (no process_vm_readv) on an
    /// oversubscribed machine.
    #[must_use]
    pub fn command(&self) -> Command {
        let mut env = self.env.clone();
        if self.interpose {
            env.push(("LD_PRELOAD".into(), self.flavour.interposer().into()));
        }
        let mut c = Command::new("timeout");
        c.args(["-k", "10", &self.timeout_secs.to_string()]);
        match self.flavour {
            Flavour::OpenMpi => {
                c.args(["mpirun.openmpi", "--allow-run-as-root", "--oversubscribe"]);
                if self.fabric.is_some() {
                    // TCP between the nodes' addresses: the bridges carry every byte.
                    c.args(["--mca", "pml", "ob1", "--mca", "btl", "self,tcp"])
                        .args(["--mca", "btl_tcp_if_include", FABRIC_SUBNET]);
                } else {
                    c.args(["--mca", "btl", "self,vader"]).args([
                        "--mca",
                        "btl_vader_single_copy_mechanism",
                        "none",
                    ]);
                }
                c.args(["-np", &self.ranks.to_string()]);
                for (k, v) in &env {
                    let mut kv = OsString::from(format!("{k}="));
                    kv.push(v);
                    c.arg("-x").arg(kv);
                }
            }
            Flavour::Mpich => {
                c.args(["mpirun.mpich", "-np", &self.ranks.to_string()]);
                for (k, v) in &env {
                    c.args(["-genv", k]).arg(v);
                }
            }
        }
        if let Some((netns, ppn)) = &self.fabric {
            c.arg(crate::target_dir().join("innet-netns-rank"))
                .arg(format!("--netns={}", netns.join(",")))
                .arg(format!("--ppn={ppn}"))
                .arg("--");
        }
        c.args(&self.program);
        c
    }

    /// Runs it; panics (with the output) unless it exits 0.
    #[must_use]
    pub fn run(&self) -> Output {
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
