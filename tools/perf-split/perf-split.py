#!/usr/bin/env python3
"""Splits a machine-wide CPU profile of a lab run into the emulated switches' work and the
hosts' own, from each sample's kernel call chain.

    perf record -a -g -F 999 -o perf.data -- sleep 10
    perf script -i perf.data -F comm,tid,ip,sym | tools/perf-split/perf-split.py

In the lab the TOR and SPINE "switches" are network namespaces on the same CPUs as the
hosts: their XDP and tc programs, the bridge and the veth ports' XDP path run in softirq,
usually inside a host's own send system call. A sample counts as

- switch: its chain holds a frame only a switch port runs: innet's programs (bpf_prog_*),
  the XDP redirect and devmap path, veth's skb-to-XDP copy (skb_pp_cow_data, page pool),
  tc ingress, bpf_clone_redirect, the bridge (br_*);
- host-rx: a host port's receive (veth NAPI, then the IPv4/UDP/TCP receive path);
- napi-other: veth NAPI work with neither (ring handling on either side);
- scheduler: sched_yield and the context switches it causes (a waiting rank's filler);
- idle: the idle loop;
- host: the rest (the ranks, their system calls, the send path down to the host's port).
"""
import collections
import re
import sys

SWITCH = re.compile(
    r"^(bpf_prog_|bpf_clone_redirect|bpf_redirect|bpf_xdp_|bpf_skb_|__bpf_spin|"
    r"skb_pp_cow_data|page_pool_|xdp_do_|__xdp_|xdp_master|dev_map_|bq_xmit|veth_xdp_xmit|"
    r"tcf_|tcx_|sch_handle_ingress|br_)"
)
IDLE = re.compile(r"^(pv_native_safe_halt|default_idle|cpuidle|do_idle|intel_idle|acpi_idle)")
NAPI = re.compile(r"^(veth_poll|veth_xdp_rcv)")
RECEIVE = ("ip_rcv", "ip_list_rcv", "ip_sublist", "ip_local", "udp", "__udp", "tcp_", "__tcp")
SCHED = ("__x64_sys_sched_yield", "do_sched_yield", "__sched_yield", "finish_task_switch")


def bucket(chain):
    if any(IDLE.match(s) for s in chain):
        return "idle"
    if any(SWITCH.match(s) for s in chain):
        return "switch"
    if any(NAPI.match(s) for s in chain):
        return "host-rx" if any(s.startswith(RECEIVE) for s in chain) else "napi-other"
    if any(s.startswith(SCHED) for s in chain):
        return "scheduler"
    return "host"


def samples(lines):
    """Each sample's call chain (leaf first) from `perf script` output."""
    chain = None
    for line in lines:
        if not line.strip():
            if chain is not None:
                yield chain
            chain = None
        elif not line[0].isspace():
            chain = []
        elif chain is not None:
            parts = line.split(None, 1)
            if len(parts) == 2:
                chain.append(parts[1].strip().split("+")[0])
    if chain is not None:
        yield chain


def main():
    counts = collections.Counter(bucket(c) for c in samples(sys.stdin))
    total = sum(counts.values())
    busy = total - counts["idle"]
    if not busy:
        sys.exit("no busy samples: was the profile taken while the run was timing?")
    print(f"{'':12} {'samples':>8} {'of all':>7} {'of busy':>8}")
    for name in ["switch", "host", "host-rx", "napi-other", "scheduler", "idle"]:
        n = counts[name]
        share = "" if name == "idle" else f"{100 * n / busy:7.1f}%"
        print(f"{name:12} {n:8d} {100 * n / total:6.1f}% {share:>8}")


if __name__ == "__main__":
    main()
