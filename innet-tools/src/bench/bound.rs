//! The fastest an allreduce can go on links that bind: what each algorithm must move over
//! a host's link per byte of the message, and the goodput that leaves at a link's rate.
//! Frames' headers are not counted (4–7 % of a frame), so a run at its bound measures
//! somewhat under 1.

use super::mpi::GOODPUT_MPI_MODE;

/// Bytes a host sends over its link (and receives: the links are full duplex, and both
/// directions carry as much) per byte of the message, for `mode` at `nodes` one-rank
/// nodes; `None` where it depends on more than these (a NIC or DPU tree's degree).
#[must_use]
pub fn link_bytes_per_byte(mode: &str, nodes: usize) -> Option<f64> {
    let n = nodes.max(1) as f64;
    match mode {
        // The switches add: each leader sends its message once and receives the result once.
        "inc-node" | "inc-socket" => Some(1.0),
        // Reduce-scatter then allgather: (n − 1)/n of the message each way, twice. OpenMPI's
        // long-message allreduce over TCP (its ring) moves the same.
        "host-ring" | GOODPUT_MPI_MODE => Some(2.0 * (n - 1.0) / n),
        // Recursive doubling: the whole message each way at each of ⌈log2 n⌉ steps.
        "host-rd" => Some(n.log2().ceil().max(1.0)),
        _ => None,
    }
}

/// The goodput bound of `mode` at `nodes` nodes (message bytes per second) on links of
/// `link_bps` bits per second.
#[must_use]
pub fn goodput_bound(mode: &str, nodes: usize, link_bps: u64) -> Option<f64> {
    Some(link_bps as f64 / 8.0 / link_bytes_per_byte(mode, nodes)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_network_moves_the_message_once_and_the_ring_nearly_twice() {
        let rate = 200_000_000; // 25 MB/s
        assert_eq!(goodput_bound("inc-node", 4, rate), Some(25e6));
        assert_eq!(goodput_bound("inc-socket", 16, rate), Some(25e6));
        // 2 (n − 1) / n: 1.5 at 4 nodes, 1.875 at 16 (the issue's own figures).
        assert_eq!(link_bytes_per_byte("host-ring", 4), Some(1.5));
        assert_eq!(link_bytes_per_byte(GOODPUT_MPI_MODE, 16), Some(1.875));
        let ring = goodput_bound("host-ring", 16, rate).expect("ring");
        assert!((ring - 25e6 / 1.875).abs() < 1e-6, "{ring}");
        // Recursive doubling: the message each way per step, 2 steps at 4 nodes, 4 at 9.
        assert_eq!(link_bytes_per_byte("host-rd", 4), Some(2.0));
        assert_eq!(link_bytes_per_byte("host-rd", 9), Some(4.0));
        // A NIC tree's bound depends on its degree: not given.
        assert_eq!(goodput_bound("inc-nic", 4, rate), None);
    }
}
