"""Reading deploy/systemd/ as systemd does, for the deploy tests.

Imported as `from helpers.systemd_units import ...`.

`parse_unit` keeps every assignment of a key in order (systemd allows
repeats: Environment=, SystemCallFilter=, ...).  `command_line` expands an
Exec*= line the way systemd.service(5) describes it: specifiers first
(%i, %I, %S, %t, %%), then the line is split into words with shell-like
quoting, then in each word "$$" becomes "$", a word that is exactly "$VAR"
becomes the variable's value split at white space (zero or more words), and
"${VAR}" anywhere becomes the exact value (so a word stays one word, even an
empty one).  Unset variables expand to nothing.
"""

from __future__ import annotations

import os
import re
import shlex

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SYSTEMD_DIR = os.path.join(REPO, "deploy", "systemd")
SERVER_UNIT = os.path.join(SYSTEMD_DIR, "dlfs-server.service")
MOUNT_UNIT = os.path.join(SYSTEMD_DIR, "dlfs-mount@.service")
SERVER_ENV = os.path.join(SYSTEMD_DIR, "dlfs-server.env")
MOUNT_ENV = os.path.join(SYSTEMD_DIR, "dlfs-mount.env")
SYSUSERS = os.path.join(SYSTEMD_DIR, "dlfs.sysusers.conf")
# Where the units expect the project's virtualenv (docs/deploy.md).
INSTALL_BIN = "/opt/dlfs/venv/bin/"

Unit = dict[str, dict[str, list[str]]]

_EXEC_PREFIXES = "-@:+!"
_SPLIT_VAR = re.compile(r"^\$([A-Za-z_][A-Za-z0-9_]*)$")
_BRACED_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def parse_unit(path: str) -> Unit:
    """Section -> key -> values in file order.  Raises ValueError on a line
    that is neither a section, a comment nor KEY=VALUE."""
    unit: Unit = {}
    section = None
    logical = ""
    with open(path) as f:
        lines = f.read().splitlines()
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not logical and (not line or line.startswith(("#", ";"))):
            continue
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        line, logical = logical + line, ""
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            unit.setdefault(section, {})
            continue
        key, sep, value = line.partition("=")
        if not sep or section is None or not key.strip():
            raise ValueError(f"{path}:{number}: not 'KEY=VALUE' inside a [Section]: {raw!r}")
        unit[section].setdefault(key.strip(), []).append(value.strip())
    return unit


def one(unit: Unit, section: str, key: str) -> str:
    """The single value of `key`; AssertionError if missing or repeated."""
    values = unit.get(section, {}).get(key, [])
    assert len(values) == 1, f"[{section}] {key}= is set {len(values)} times: {values}"
    return values[0]


def parse_env_file(path: str) -> dict[str, str]:
    """VAR=value lines of an EnvironmentFile= (comments and blanks skipped)."""
    env = {}
    with open(path) as f:
        for number, raw in enumerate(f, start=1):
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            key, sep, value = line.partition("=")
            if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"{path}:{number}: not VAR=value: {raw!r}")
            env[key] = value
    return env


def specifiers(text: str, values: dict[str, str]) -> str:
    """Replace %X specifiers; a specifier missing from `values` is an error."""
    def replace(match: re.Match) -> str:
        letter = match.group(1)
        if letter == "%":
            return "%"
        if letter not in values:
            raise KeyError(f"specifier %{letter} in {text!r} has no test value")
        return values[letter]
    return re.sub(r"%(.)", replace, text)


def unit_environment(unit: Unit, spec: dict[str, str], *env_files: str,
                     overrides: dict[str, str] | None = None) -> dict[str, str]:
    """Environment= defaults, then each EnvironmentFile in order, then `overrides`."""
    env: dict[str, str] = {}
    for assignment in unit["Service"].get("Environment", []):
        for word in shlex.split(specifiers(assignment, spec)):
            key, _, value = word.partition("=")
            env[key] = value
    for path in env_files:
        env.update(parse_env_file(path))
    env.update(overrides or {})
    return env


def command_line(line: str, env: dict[str, str], spec: dict[str, str]) -> list[str]:
    """argv of one Exec*= value (its "-", "@", "+", "!" prefixes dropped)."""
    line = line.lstrip(_EXEC_PREFIXES)
    argv: list[str] = []
    for word in shlex.split(specifiers(line, spec)):
        whole = _SPLIT_VAR.match(word)
        if whole:
            argv.extend(env.get(whole.group(1), "").split())
            continue
        word = word.replace("$$", "\0")
        word = _BRACED_VAR.sub(lambda m: env.get(m.group(1), ""), word)
        argv.append(word.replace("\0", "$"))
    return argv


def referenced_variables(line: str) -> set[str]:
    """Names used as $VAR or ${VAR} in an Exec*= line ($$ is a literal $)."""
    line = line.replace("$$", "")
    return set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", line))
