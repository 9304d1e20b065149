#!/usr/bin/env python3
"""Generate the protobuf/gRPC modules of src/dlfs/proto from dlfs.proto.

    python scripts/gen_proto.py           # regenerate in place
    python scripts/gen_proto.py --check   # exit 1 if the committed modules are stale

The generated files are never edited by hand; the test suite runs --check.
"""

from __future__ import annotations

import argparse
import filecmp
import pathlib
import sys
import tempfile

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
PROTO = pathlib.Path("dlfs/proto/dlfs.proto")
GENERATED = ("dlfs_pb2.py", "dlfs_pb2.pyi", "dlfs_pb2_grpc.py")


def generate(out_dir: pathlib.Path) -> None:
    """Run protoc on dlfs.proto, writing the modules below `out_dir`."""
    args = [
        "protoc",
        f"-I{SRC}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(SRC / PROTO),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare, do not write")
    options = parser.parse_args()
    if not options.check:
        generate(SRC)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(pathlib.Path(tmp))
        stale = [
            name
            for name in GENERATED
            if not (SRC / PROTO.parent / name).exists()
            or not filecmp.cmp(pathlib.Path(tmp) / PROTO.parent / name, SRC / PROTO.parent / name, shallow=False)
        ]
    if stale:
        print(f"stale generated modules: {', '.join(stale)}; run python scripts/gen_proto.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
