#!/usr/bin/env bash
# Issue 36's 16-core table on the GPU machine (../shared/device/README.md) in one command of
# about 7 minutes.  Here first:
#
#   bash ../shared/device/prepare.sh
#   bash bench/native_for.sh /root/.pyenv/versions/3.12.1/bin/python   # any python3.12 + headers
#
# then `run` with carry [".device", "src/dlfs/client/transport/native_exchange.cpython-312-x86_64-linux-gnu.so",
#                         "src/dlfs/server/read/native_send.cpython-312-x86_64-linux-gnu.so"]:
#
#   source .device/setup.sh && bash bench/device_scaling.sh
#
# 1. `python3 -m bench.scaling`: 1, 2, 4, 8, 12 client processes against one daemon, and raw
#    TCP with as many connections, the clients on the C exchange and the daemon on its C send
#    (the table says which each used: without the carried builds, the Python ones).
# 2. The same for 8 and 12 clients with both in Python (DLFS_NATIVE=0), two windows each: the
#    Python exchange checks each window's CRCs as the next arrives, the C one after the last
#    frame (docs/DESIGN.md, "The C exchange"), and only a machine with cores to spare tells
#    which pays.
#
# Writes c/ and python/ (scaling.md, scaling.json) under $OUT (the device machine's folder
# that comes back), else bench/results/device.  Extra arguments go to both runs (to try it
# here: --quick --clients 1,2).  Exits non-zero if either run failed, after both ran.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/bench/results/device}
data=${DLFS_BENCH_DATA:-/tmp/dlfs-bench}
cd "$root" || exit
status=0
python3 -m bench.scaling --data-dir "$data" --out "$out/c" "$@" || status=1
DLFS_NATIVE=0 python3 -m bench.scaling --data-dir "$data" --clients 8,12 --runs 2 \
  --out "$out/python" "$@" || status=1
for side in c python; do
  [ -f "$out/$side/scaling.md" ] && { echo "== $side"; sed -n '/^| clients N/,/^$/p' "$out/$side/scaling.md"; }
done
exit $status
