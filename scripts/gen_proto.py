#!/usr/bin/env python3
"""Generate the protobuf/gRPC modules of src/dlfs/proto from dlfs.proto and etcd_api.proto.

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
PROTO_DIR = pathlib.Path("dlfs/proto")
# dlfs.proto: the daemon's service; etcd_api.proto: the subset of etcd's v3 API DLFS uses.
PROTOS = ("dlfs.proto", "etcd_api.proto")
GENERATED = tuple(f"{pathlib.Path(p).stem}{suffix}" for p in PROTOS
                  for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"))


def generate(out_dir: pathlib.Path) -> None:
    """Run protoc on every proto of PROTOS, writing the modules below `out_dir`."""
    args = [
        "protoc",
        f"-I{SRC}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(SRC / PROTO_DIR / proto) for proto in PROTOS),
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
            if not (SRC / PROTO_DIR / name).exists()
            or not filecmp.cmp(pathlib.Path(tmp) / PROTO_DIR / name, SRC / PROTO_DIR / name, shallow=False)
        ]
    if stale:
        print(f"stale generated modules: {', '.join(stale)}; run python scripts/gen_proto.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
