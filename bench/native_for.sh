#!/usr/bin/env bash
# Build the C extensions (the client's exchange, src/dlfs/client/transport/native_exchange.c,
# and the daemon's send, src/dlfs/server/read/native_send.c) for another Python than the
# venv's, next to the venv's builds, so that a machine that runs the project from src/
# without building it (the GPU machine: python3.12, no compiler, no package index;
# ../shared/device/README.md) still uses them:
#
#   bash bench/native_for.sh /root/.pyenv/versions/3.12.1/bin/python   # here
#   then carry the two paths it prints (src/dlfs/.../*.cpython-312-x86_64-linux-gnu.so)
#
# The builds live side by side (each interpreter loads the one with its own suffix; git
# ignores them).  The C files need only Python's headers and libm.  Usage: PYTHON [SRCDIR]
# (SRCDIR holds the dlfs package; default src/); prints the paths it wrote.  CC may carry
# flags of its own: tests/packaging/test_sanitizers.py builds with the sanitizers so.
set -euo pipefail
python=${1:?usage: bash bench/native_for.sh PYTHON [SRCDIR]}
root=$(cd "$(dirname "$0")/.." && pwd)
out=${2:-$root/src}
read -r include suffix < <("$python" -c \
  'import sysconfig; print(sysconfig.get_paths()["include"], sysconfig.get_config_var("EXT_SUFFIX"))')
for module in dlfs/client/transport/native_exchange dlfs/server/read/native_send; do
  target=$out/$module$suffix
  # The flags setup.py gives (-O2 -std=c11, warnings), as a shared object.
  ${CC:-cc} -shared -fPIC -O2 -std=c11 -Wall -Wextra -Werror=implicit-function-declaration \
    -I"$include" "$root/src/$module.c" -o "$target" -lm
  echo "$target"
done
