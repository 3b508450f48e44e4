#!/bin/bash
cd /work/main
B="./target/release/innet-bench --no-latency --no-xdp --no-apps --no-barrier --no-overlap --no-breakdown --no-bystander --goodput-mtu 1500 --spin-us 0 --goodput-iterations 5"
G="--no-mpi --goodput-modes host-ring,inc-node --goodput-dtypes float64,int64"
run() { name=$1; shift; echo "$(date +%T) start $name"; timeout 2400 $B "$@" --out /tmp/sw2/$name > /tmp/sw2/$name.log 2>&1; echo "$(date +%T) end $name rc=$?"; }
run n4-l2 $G --goodput-nodes 4 --levels 2 --link-rate 100mbit --goodput-sizes 65536,262144,1048576,4194304,16777216,67108864
run n16-l2 $G --goodput-nodes 16 --levels 2 --link-rate 40mbit --goodput-sizes 65536,1048576,16777216
run n4-l2-lossfree --no-mpi --no-goodput-mpi --goodput-modes inc-node --goodput-nodes 4 --levels 2 --link-rate 100mbit --goodput-sizes 1048576,16777216
run n4-l2-loss1 --no-mpi --no-goodput-mpi --goodput-modes inc-node --goodput-nodes 4 --levels 2 --link-rate 100mbit --link-loss 1 --goodput-sizes 1048576,16777216
run mpi-4x1 --no-goodput --mpi-sizes 4,256,1048576,4194304 --mpi-shapes 4x1 --iterations 400 --link-rate 100mbit
run n4-l1 $G --goodput-nodes 4 --levels 1 --link-rate 100mbit --goodput-sizes 65536,1048576,16777216
run n4-l3 $G --goodput-nodes 4 --levels 3 --link-rate 100mbit --goodput-sizes 65536,1048576,16777216
echo all done
