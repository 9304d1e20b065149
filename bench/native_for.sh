#!/usr/bin/env bash
# Build the client's C exchange (src/dlfs/client/transport/native_exchange.c) for another
# Python than the venv's, next to the venv's build, so that a machine that runs the project
# from src/ without building it (the GPU machine: python3.12, no compiler, no package index;
# ../shared/device/README.md) still uses it:
#
#   bash bench/native_for.sh /root/.pyenv/versions/3.12.1/bin/python   # here
#   then carry src/dlfs/client/transport/native_exchange.cpython-312-x86_64-linux-gnu.so
#
# Both builds live side by side (each interpreter loads the one with its own suffix; git
# ignores them).  The C file needs only Python's headers and libm.  Usage: PYTHON [OUTDIR];
# prints the path it wrote.
set -euo pipefail
python=${1:?usage: bash bench/native_for.sh PYTHON [OUTDIR]}
root=$(cd "$(dirname "$0")/.." && pwd)
out=${2:-$root/src/dlfs/client/transport}
read -r include suffix < <("$python" -c \
  'import sysconfig; print(sysconfig.get_paths()["include"], sysconfig.get_config_var("EXT_SUFFIX"))')
target=$out/native_exchange$suffix
# The flags setup.py gives (-O2 -std=c11, warnings), as a shared object.
${CC:-cc} -shared -fPIC -O2 -std=c11 -Wall -Wextra -Werror=implicit-function-declaration \
  -I"$include" "$root/src/dlfs/client/transport/native_exchange.c" -o "$target" -lm
echo "$target"
