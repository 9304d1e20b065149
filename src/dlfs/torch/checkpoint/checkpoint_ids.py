"""Checkpoint ids (`dlfs://HOST:PORT/SPACE/DIR`) and the clients that reach them.

A checkpoint id names a directory of a checkpoint space on one daemon:

    dlfs://10.0.0.5:7010/ckpt/run1/step100   daemon 10.0.0.5:7010, space "ckpt",
                                             directory "run1/step100"
    dlfs:///ckpt/run1/step100                the daemon of $DLFS_SERVER, else
                                             127.0.0.1:7010
    dlfs://[::1]:7010/ckpt                   the space's root directory

`parse_checkpoint_id` turns one into a `CheckpointLocation` (InvalidArgument
for anything else: another scheme, no space, a space or path name the
daemon would refuse); `is_checkpoint_id` says whether a string is one,
without raising (what `validate_checkpoint_id` answers).  `shared_client`
gives one `Client` per daemon address (and client options) and process, made
on first use, so the writers and readers of one process share its
connections.
"""

from __future__ import annotations

import os
import threading
import urllib.parse
from dataclasses import dataclass

from dlfs import limits
from dlfs.client import Client
from dlfs.errors import InvalidArgument
from dlfs.paths import check_dataset_name, check_sample_path

SCHEME = "dlfs"
SERVER_ENV = "DLFS_SERVER"  # the daemon of a `dlfs:///SPACE/DIR` id (as the CLI's)
SERVER_DEFAULT = f"127.0.0.1:{limits.daemon_port_default}"


@dataclass(frozen=True)
class CheckpointLocation:
    """Directory `directory` ("" for the root) of space `space` on daemon `address`."""

    address: str
    space: str
    directory: str

    def path(self, name: str) -> str:
        """The space path of file `name` of the checkpoint directory."""
        return f"{self.directory}/{name}" if self.directory else name

    def __str__(self) -> str:
        return f"{SCHEME}://{self.address}/{self.space}" + \
            (f"/{self.directory}" if self.directory else "")


def parse_checkpoint_id(checkpoint_id) -> CheckpointLocation:
    """The location `checkpoint_id` names (see the module); InvalidArgument otherwise."""
    text = os.fspath(checkpoint_id) if isinstance(checkpoint_id, os.PathLike) else checkpoint_id
    if not isinstance(text, str) or not text.startswith(f"{SCHEME}://"):
        raise InvalidArgument(f"checkpoint id {checkpoint_id!r} is not a DLFS one: write "
                              f"{SCHEME}://HOST:PORT/SPACE/DIR (or {SCHEME}:///SPACE/DIR for "
                              f"${SERVER_ENV}, else {SERVER_DEFAULT})")
    parts = urllib.parse.urlsplit(text)
    if parts.query or parts.fragment:
        raise InvalidArgument(f"checkpoint id {text!r} has a query or fragment ('?', '#'): "
                              f"write {SCHEME}://HOST:PORT/SPACE/DIR")
    address = parts.netloc or os.environ.get(SERVER_ENV) or SERVER_DEFAULT
    space, _, directory = parts.path.strip("/").partition("/")
    if not space:
        raise InvalidArgument(f"checkpoint id {text!r} names no space: write "
                              f"{SCHEME}://{address}/SPACE/DIR")
    check_dataset_name(space)
    directory = directory.strip("/")
    check_sample_path(directory, allow_root=True)
    return CheckpointLocation(address, space, directory)


def is_checkpoint_id(checkpoint_id) -> bool:
    """Whether `checkpoint_id` is a valid DLFS checkpoint id (never raises)."""
    try:
        parse_checkpoint_id(checkpoint_id)
        return True
    except InvalidArgument:
        return False


class CheckpointStorage:
    """What `DLFSWriter` and `DLFSReader` share: the location of the checkpoint (set by
    `locate`, from the constructor's id or `reset`'s) and the client that reaches it."""

    location: CheckpointLocation | None = None
    _client: Client | None = None
    _client_options: dict | None = None  # how to make another like `_client`

    def use_client(self, client: Client | None) -> None:
        self._client = client
        self._client_options = client.options if client is not None else None

    def locate(self, checkpoint_id) -> None:
        """Point at `checkpoint_id` (None: stay where it is)."""
        if checkpoint_id is not None:
            self.location = parse_checkpoint_id(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return is_checkpoint_id(checkpoint_id)

    @property
    def checkpoint_id(self) -> str | None:
        return None if self.location is None else str(self.location)

    def located(self) -> CheckpointLocation:
        """The location; ValueError before any id was given."""
        if self.location is None:
            raise ValueError(f"{type(self).__name__} has no checkpoint id: pass one to it or "
                             "to dcp.save / dcp.load (checkpoint_id=...)")
        return self.location

    def daemon_client(self) -> Client:
        """The client given, else this process's for the location's daemon."""
        return self._client or shared_client(self.located().address, self._client_options)


_clients: dict[tuple, Client] = {}
_clients_lock = threading.Lock()


def shared_client(address: str, options: dict | None = None) -> Client:
    """This process's client of daemon `address` made with `options` (`Client`'s
    keyword arguments, as `Client.options` holds them; None: the defaults), made on
    first use and kept for the process's life; a forked child makes its own."""
    options = {k: v for k, v in (options or {}).items() if k not in ("etcd", "cluster")}
    key = (os.getpid(), address, tuple(sorted(options.items())))
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = Client(address, **options)
        return client
