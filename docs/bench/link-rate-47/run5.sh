#!/bin/bash
cd /work/main
B="./target/release/innet-bench --no-latency --no-xdp --no-apps --no-barrier --no-overlap --no-breakdown --no-bystander --goodput-mtu 1500 --spin-us 0 --goodput-iterations 5 --no-mpi --no-goodput-mpi"
run() { name=$1; shift; echo "$(date +%T) start $name"; timeout 1200 $B "$@" --out /tmp/pl/$name > /tmp/pl/$name.log 2>&1; rc=$?; echo "$(date +%T) end $name rc=$rc"; }
run w64-lossfree --goodput-modes inc-node --goodput-nodes 4 --levels 2 --link-rate 100mbit --goodput-windows 64 --goodput-sizes 1048576,16777216
run w64-loss1 --goodput-modes inc-node --goodput-nodes 4 --levels 2 --link-rate 100mbit --goodput-windows 64 --link-loss 1 --goodput-sizes 1048576,16777216
echo all done
