//! One rank of a job in a process of its own, so a test can kill it mid-job (`SIGKILL`: no
//! goodbye, no kill packet, sockets gone) and watch what the other ranks and the switches
//! do. Joins the communicator, runs `--calls` checked allreduces (case `i` of
//! `innet_lab::job::input`), starts one more and prints `started` when it is in flight,
//! then waits to be killed.

use std::{io::Write as _, net::Ipv4Addr};

use clap::Parser;
use innet_client::{Communicator, Config, Dtype, Layout, Mode, NodePlacement, Op};
use innet_lab::job::checked_allreduce;

#[derive(Parser)]
struct Args {
    #[arg(long)]
    job: u64,
    #[arg(long)]
    rank: usize,
    /// Ranks in the job (one per node)
    #[arg(long)]
    size: usize,
    #[arg(long)]
    mode: Mode,
    /// Each node's address, in node order (all under TOR 0)
    #[arg(long, value_delimiter = ',')]
    nodes: Vec<Ipv4Addr>,
    #[arg(long)]
    calls: usize,
}

fn main() {
    let a = Args::parse();
    let layout = Layout::new(a.size, 1, 1).expect("layout");
    let nodes = a
        .nodes
        .iter()
        .map(|ip| NodePlacement::new(0, vec![*ip]))
        .collect();
    let mut cfg = Config::new(a.job, a.rank, layout, nodes);
    cfg.mode = a.mode;
    let mut comm = Communicator::new(cfg).expect("join");
    for case in 0..a.calls {
        checked_allreduce(&mut comm, case, Op::Sum, Dtype::I32, 4);
    }
    println!("done {}", a.calls);
    let _ = std::io::stdout().flush();
    // The next collective: this rank's contribution goes out, then the process is killed
    // while it waits for the others.
    let send = innet_lab::job::input(a.rank, a.calls, Op::Sum, Dtype::I32, 4);
    let mut recv = vec![0u8; send.len()];
    std::thread::spawn(|| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        println!("started");
        let _ = std::io::stdout().flush();
    });
    let _ = comm.allreduce_bytes(&send, &mut recv, Op::Sum, Dtype::I32);
    std::thread::park();
}
