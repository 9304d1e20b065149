"""The one C extension: the data path client's GET_BATCH exchange (pyproject.toml has
everything else).  Optional: without a C compiler the package installs pure Python
and the client uses its Python exchange (docs/DESIGN.md, "Client and transports")."""

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "dlfs.client.transport.native_exchange",
    sources=["src/dlfs/client/transport/native_exchange.c"],
    extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra",
                        "-Werror=implicit-function-declaration"],
    libraries=["m"],  # ceil
    optional=True,
)])
