#!/bin/bash
cd /work/main
while pgrep -f "/tmp/sw2/run.sh|/tmp/sw2/run2.sh|/tmp/sw2/run3.sh" > /dev/null; do sleep 5; done
echo "$(date +%T) start mpi-4x1-unshaped"
timeout 1200 ./target/release/innet-bench --no-latency --no-xdp --no-apps --no-barrier --no-overlap --no-breakdown --no-bystander --no-goodput --mpi-sizes 4,256 --mpi-shapes 4x1 --iterations 400 --out /tmp/sw2/mpi-4x1-unshaped > /tmp/sw2/mpi-4x1-unshaped.log 2>&1
echo "$(date +%T) end rc=$?"
