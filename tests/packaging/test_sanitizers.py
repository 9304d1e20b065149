"""The C extensions built with AddressSanitizer and UndefinedBehaviorSanitizer pass their
own tests: an out-of-bounds read, an unaligned load or an integer conversion out of
range in native_send.c or native_exchange.c ends the run with the sanitizer's report.

The builds come from bench/native_for.sh (the flags setup.py gives, which
test_native_for.py holds it to) with the sanitizers added through CC, into a copy of
the package; the tests run in a child pytest whose imports find that copy first, its
daemons too (they inherit the environment), with libasan preloaded (Python itself is
not built with it).  Leak checks are off: the interpreter keeps memory until exit by
design.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# float-cast-overflow is not in GCC's "undefined" group; -fno-sanitize-recover makes
# every finding end the process (a report alone would let the tests pass).
SANITIZE = ("-fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all "
            "-fno-omit-frame-pointer -g")
# The extensions' own tests: each of the C calls against scripted peers and real
# extent files (the first two), and the daemon's C send behind real requests (the last).
EXTENSION_TESTS = ("tests/server/read/test_native_send.py", "tests/client/test_batch_exchange.py",
                   "tests/e2e/test_small_sample_sends.py")
CHILD_TIMEOUT_S = 400

pytestmark = pytest.mark.slow


def _libasan(cc: str) -> str:
    path = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True,
                          timeout=30).stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else ""


@pytest.mark.timeout(CHILD_TIMEOUT_S + 120)
def test_the_c_extensions_pass_their_tests_under_asan_and_ubsan(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "no C compiler: ./dev setup installs gcc"
    libasan = _libasan(cc)
    assert libasan, f"{cc} has no libasan (Debian: apt-get install libasan8)"
    shutil.copytree(os.path.join(REPO, "src", "dlfs"), tmp_path / "dlfs",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    built = subprocess.run(["bash", os.path.join(REPO, "bench", "native_for.sh"), sys.executable,
                            str(tmp_path)], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "CC": f"{cc} {SANITIZE}"})
    assert built.returncode == 0, built.stderr
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "LD_PRELOAD": libasan,
           "ASAN_OPTIONS": "detect_leaks=0", "UBSAN_OPTIONS": "print_stacktrace=1"}
    env.pop("DLFS_NATIVE", None)
    probe = ("from dlfs.client.transport import datapath_conn; "
             "from dlfs.server.read import mapped_sends; "
             "print(datapath_conn.native.__file__, mapped_sends.native.__file__)")
    used = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=60)
    assert used.returncode == 0, used.stderr
    assert used.stdout.split() == built.stdout.split()
    # -s: a sanitizer's report goes to the process's stderr, which pytest's capture
    # would otherwise swallow with the process.
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                          *EXTENSION_TESTS], capture_output=True, text=True, env=env, cwd=REPO,
                         timeout=CHILD_TIMEOUT_S)
    output = run.stdout + run.stderr
    assert "runtime error:" not in output and "Sanitizer" not in output, output[-6000:]
    assert run.returncode == 0, output[-6000:]
    assert " passed" in output and " skipped" not in output, output[-2000:]
