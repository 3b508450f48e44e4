//! What the MPI tests share: a fabric of 2 TORs × 2 nodes under a SPINE, and a directory
//! of the test's own for placement files and rank reports.

use std::path::PathBuf;

use innet::loader::XdpMode;

use crate::{
    daemons::{DaemonGuard, daemons_on, learn_hosts},
    topology::{Shape, Topology},
};

/// 2 TORs × 2 nodes (one socket each) under a SPINE, native XDP, the hosts' neighbours
/// learned; `innet daemon` on every switch when `with_daemons`.
#[must_use]
pub fn mpi_fabric(with_daemons: bool) -> (Topology, Vec<DaemonGuard>) {
    let topo = Topology::new(Shape {
        tors: 2,
        hosts_per_tor: 2,
        sockets: 1,
        spines: 1,
        mode: XdpMode::Native,
        ..Shape::small()
    });
    learn_hosts(&topo);
    let daemons = if with_daemons {
        daemons_on(&topo, &[])
    } else {
        vec![]
    };
    (topo, daemons)
}

/// A directory of a test's own with a `reports` directory in it, removed at the end.
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// `innet-<tag>-<pid>` under the temporary directory, emptied first.
    #[must_use]
    pub fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("innet-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(p.join("reports")).expect("scratch dir");
        Self(p)
    }

    /// Where the interposer writes the rank reports.
    #[must_use]
    pub fn reports(&self) -> PathBuf {
        self.0.join("reports")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
