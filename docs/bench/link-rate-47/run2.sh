#!/bin/bash
cd /work/main
while pgrep -f /tmp/sw2/run.sh > /dev/null; do sleep 5; done
B="./target/release/innet-bench --no-latency --no-xdp --no-apps --no-barrier --no-overlap --no-breakdown --no-bystander --goodput-mtu 1500 --spin-us 0 --goodput-iterations 5 --no-mpi"
run() { name=$1; shift; echo "$(date +%T) start $name"; timeout 2400 $B "$@" --out /tmp/sw2/$name > /tmp/sw2/$name.log 2>&1; echo "$(date +%T) end $name rc=$?"; }
run n4-l2-25mbit --goodput-modes host-ring,inc-node --goodput-dtypes float64 --goodput-nodes 4 --levels 2 --link-rate 25mbit --goodput-sizes 1048576,4194304,16777216
echo all done
