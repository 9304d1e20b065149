"""The C extensions (pyproject.toml has everything else): the data path client's GET_BATCH
exchange, and the daemon's send of a whole GET_BATCH reply from mappings of extents.
Optional: without a C compiler the package installs pure Python, and each side uses its
Python code (docs/DESIGN.md, "Client and transports" and "How the daemon sends")."""

from setuptools import Extension, setup

# The flags both are built with (bench/native_for.sh repeats them for another Python).
COMPILE_ARGS = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"]

setup(ext_modules=[
    Extension(
        "dlfs.client.transport.native_exchange",
        sources=["src/dlfs/client/transport/native_exchange.c"],
        extra_compile_args=COMPILE_ARGS,
        libraries=["m"],  # ceil
        optional=True,
    ),
    Extension(
        "dlfs.server.read.native_send",
        sources=["src/dlfs/server/read/native_send.c"],
        extra_compile_args=COMPILE_ARGS,
        optional=True,
    ),
])
