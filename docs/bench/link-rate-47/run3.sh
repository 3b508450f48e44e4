#!/bin/bash
cd /work/main
while pgrep -f "/tmp/sw2/run.sh|/tmp/sw2/run2.sh" > /dev/null; do sleep 5; done
B="./target/release/innet-bench --no-latency --no-xdp --no-apps --no-barrier --no-overlap --no-breakdown --no-bystander --goodput-mtu 1500 --spin-us 0 --goodput-iterations 5 --no-mpi --no-goodput-mpi"
run() { name=$1; shift; echo "$(date +%T) start $name"; timeout 2400 $B "$@" --out /tmp/sw2/$name > /tmp/sw2/$name.log 2>&1; echo "$(date +%T) end $name rc=$?"; }
run n4-l2-w64-lossfree --goodput-modes inc-node --goodput-nodes 4 --levels 2 --link-rate 100mbit --goodput-windows 64 --goodput-sizes 1048576,16777216
run n4-l2-w64-loss1 --goodput-modes inc-node --goodput-nodes 4 --levels 2 --link-rate 100mbit --goodput-windows 64 --link-loss 1 --goodput-sizes 1048576,16777216
echo all done
