"""Tooling shared by tests and benchmarks: starting and stopping real daemons and mounts."""
