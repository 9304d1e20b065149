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
"""

from __future__ import annotations

from dlfs import errors
from dlfs.errors import DlfsError, Internal


def report_error(conn, epoch: int, number: int, exc: BaseException) -> None:
    """Send `exc` as batch `number`'s error of `epoch` (number -1: the helper failed to start).

    A DLFS error keeps its class name and message; anything else becomes
    Internal naming the exception.  Raises what ``conn.send`` raises.
    """
    if isinstance(exc, DlfsError):
        conn.send(("error", epoch, number, type(exc).__name__, exc.message))
    else:
        conn.send(("error", epoch, number, "Internal",
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
