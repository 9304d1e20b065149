"""`dlfs-server --config FILE`: the daemon's settings from a TOML file, flags over them.

    # /etc/dlfs/server.toml
    data_dir = "/var/lib/dlfs"
    listen = "0.0.0.0:7010"
    tls_cert = "/etc/dlfs/tls/server.pem"
    tls_key = "/etc/dlfs/tls/server.key"
    tokens_file = "/etc/dlfs/tokens"
    metrics_listen = "9110"
    batch_bytes_max = "256MiB"      # sizes: bytes, or a string with KiB/MiB/GiB/TiB
    log_format = "json"

Keys are the settings of `ServerConfig` and the daemon's own options
(`DAEMON_OPTIONS`), named as the flags are with '_' for '-' (either
spelling is accepted).  Precedence: a flag on the command line, else the
file, else the environment (`ENVIRONMENT`: $DLFS_ETCD, $DLFS_CLUSTER), else the
default.  `to_toml` writes the effective settings back in
this format (`dlfs-server --print-config`), so its output is a valid file.
Read with the standard library's `tomllib`; unknown keys and values of the
wrong type are refused with a message naming the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import tomllib
from typing import Mapping

from dlfs.server.config import ServerConfig
from dlfs.units import parse_size, size_text

# Options of the `dlfs-server` process that are not ServerConfig fields, with
# their defaults.
DAEMON_OPTIONS = {"address_file": "", "demo": False, "log_level": "INFO", "log_format": "text"}
# Settings an environment variable gives when neither a flag nor the file does: the
# cluster's etcd, named once for the daemon, the CLI and the mount of a job.
ENVIRONMENT = {"etcd": "DLFS_ETCD", "cluster": "DLFS_CLUSTER"}

_EXAMPLE_CONFIG = ServerConfig(data_dir=".")
# Every key a file may hold -> its default (its type is the default's type).
DEFAULTS: dict[str, object] = {
    **{f.name: getattr(_EXAMPLE_CONFIG, f.name) for f in dataclasses.fields(ServerConfig)
       if f.name != "data_dir"},
    **DAEMON_OPTIONS}
KEYS = ("data_dir", *DEFAULTS)


def is_size(key: str) -> bool:
    """Settings in bytes: written and shown with binary units."""
    return "bytes" in key


def read_config_file(path: str) -> dict[str, object]:
    """The settings in TOML file `path`, keys normalised to '_' spelling.  Raises
    ValueError naming the file and the key that is unknown or has the wrong type."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except OSError as exc:
        raise ValueError(f"--config {path}: cannot read it ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"--config {path}: not valid TOML ({exc})") from None
    settings: dict[str, object] = {}
    for raw_key, value in raw.items():
        key = raw_key.replace("-", "_")
        if key not in KEYS:
            close = difflib.get_close_matches(key, KEYS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else \
                "; `dlfs-server --print-config` lists the settings"
            raise ValueError(f"--config {path}: unknown setting {raw_key!r}{hint}")
        settings[key] = _checked(path, key, value)
    return settings


def _checked(path: str, key: str, value: object) -> object:
    """`value` as the type of setting `key`; sizes may be strings with units."""
    want = str if key == "data_dir" else type(DEFAULTS[key])
    if want is int and is_size(key) and isinstance(value, str):
        try:
            return parse_size(value)
        except ValueError as exc:
            raise ValueError(f"--config {path}: {key}: {exc}") from None
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if type(value) is not want:
        raise ValueError(f"--config {path}: {key} must be {_type_name(want, key)}, not "
                         f"{json.dumps(value, default=str)}")
    return value


def _type_name(want: type, key: str) -> str:
    if want is int and is_size(key):
        return "a size (bytes, or a string such as \"64MiB\")"
    return {bool: "true or false", int: "an integer", float: "a number",
            str: "a string"}[want]


def from_environment(environ: Mapping[str, str]) -> dict[str, object]:
    """The settings `ENVIRONMENT` names that `environ` sets (non-empty)."""
    return {key: environ[name] for key, name in ENVIRONMENT.items() if environ.get(name)}


def effective(file_settings: dict[str, object], flag_settings: dict[str, object],
              environ: Mapping[str, str] | None = None) -> dict[str, object]:
    """Every setting: the flag's value where given, else the file's, else the
    environment's (`ENVIRONMENT`, read from `environ`), else the default (data_dir has
    none: absent when neither gives it)."""
    return {**DEFAULTS, **from_environment(environ or {}), **file_settings, **flag_settings}


def server_config(settings: dict[str, object]) -> ServerConfig:
    """The ServerConfig of `effective` settings.  Raises ValueError (a bad value)."""
    return ServerConfig(**{f.name: settings[f.name] for f in dataclasses.fields(ServerConfig)})


def to_toml(settings: dict[str, object]) -> str:
    """`settings` as a TOML file `read_config_file` reads back to the same values: one
    line each, in KEYS order, sizes with their binary-unit reading as a comment."""
    lines = ["# dlfs-server settings (dlfs-server --config FILE reads this back)"]
    if "data_dir" not in settings:
        lines.append("# data_dir = \"...\"  # required: give it here or with --data-dir")
    for key in KEYS:
        if key not in settings:
            continue
        value = settings[key]
        text = json.dumps(value)  # TOML's basic strings, integers, floats and booleans
        if is_size(key) and isinstance(value, int) and value >= 1024:
            text += f"  # {size_text(value)}"
        lines.append(f"{key} = {text}")
    return "\n".join(lines) + "\n"
