"""The messages between a `BatchRing` and its helper process, over one duplex pipe.

The ring itself is a memfd passed over the same pipe before anything else.

parent -> helper:

- ``("epoch", n, ids, batch_size, drop_last, prefetch, hint_ahead, verify,
  trace_dir)``: read `ids` as epoch `n`; a running epoch is abandoned;
- ``("free", slot)``: the parent no longer references `slot`;
- ``("cancel", n)``: stop reading epoch `n`;
- ``("stop",)``: exit.

helper -> parent:

- ``("ready",)``: the helper has its client and the ring mapped;
- ``("batch", n, number, slot, count, size, ragged)``: batch `number` of
  epoch `n` is in `slot`; ``ragged`` is None when every sample has
  ``size`` bytes, else their int64 lengths as bytes (and ``size`` is -1);
- ``("error", n, number, kind, message)``: see `report_error`.

Messages of an epoch the parent has left are dropped (their slots freed).
The helper exits when told to, or when the pipe breaks (the parent is gone).
Both ends speak through a `Channel`.
"""

from __future__ import annotations

import pickle
import select

from dlfs import errors
from dlfs.errors import DlfsError, Internal


class Channel:
    """One end of the ring's pipe (a `multiprocessing.connection.Connection`) for these messages.

    The messages are plain tuples, pickled with the standard pickler and
    framed as the Connection frames bytes.  Why not ``Connection.send`` and
    ``poll``: its ForkingPickler copies the copyreg dispatch table on every
    message, and every ``poll`` builds a selector: with two messages and a
    poll per batch, a visible share of the training thread's time
    (log-train.md).  Nothing here needs
    ForkingPickler's reducers: the ring's memfd goes by ``send_handle`` on
    `conn` before the first message.  Raises what the Connection raises
    (EOFError, OSError) when the other end is gone.
    """

    def __init__(self, conn):
        self.conn = conn
        self._poller = select.poll()
        self._poller.register(conn.fileno(), select.POLLIN)

    def send(self, message: tuple) -> None:
        self.conn.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))

    def recv(self) -> tuple:
        return pickle.loads(self.conn.recv_bytes())

    def poll(self, timeout_s: float) -> bool:
        """Whether a message (or the end of the pipe) is there, waiting up to `timeout_s`."""
        return bool(self._poller.poll(timeout_s * 1000.0))


def report_error(channel: Channel, epoch: int, number: int, exc: BaseException) -> None:
    """Send `exc` as batch `number`'s error of `epoch` (number -1: the helper failed to start).

    A DLFS error keeps its class name and message; anything else becomes
    Internal naming the exception.  Raises what ``channel.send`` raises.
    """
    if isinstance(exc, DlfsError):
        channel.send(("error", epoch, number, type(exc).__name__, exc.message))
    else:
        channel.send(("error", epoch, number, "Internal",
                      f"read-ahead process failed: {type(exc).__name__}: {exc}"))


def raise_error(message) -> None:
    """Raise the error a helper reported as ``("error", epoch, number, kind, text)``.

    The class is the `dlfs.errors` class named `kind`, or Internal when
    there is no such DLFS error class.
    """
    kind, text = message[3], message[4]
    cls = getattr(errors, kind, None)
    if not (isinstance(cls, type) and issubclass(cls, DlfsError)):
        cls = Internal
    raise cls(text)
