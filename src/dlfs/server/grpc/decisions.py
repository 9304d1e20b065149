"""How a member of a striped dataset learns a two-phase ingest's outcome from the first member.

The client commits a striped ingest on its first member before the others,
so that member's SEAL is the decision (see `dlfs.client.cluster.striped_ingest`).  A member
that is left prepared (it restarted, or the client died between commits)
asks the first member with GetIngestOutcome, as `IngestMachine.decisions`
(the daemon sets `store.ingests.decisions`), and commits or aborts
accordingly (`IngestMachine._learn_outcome`).

The call uses the daemon's own credentials: the first token of its tokens
file (members of one cluster share one), and when it serves TLS, its own
certificate as the client certificate and the CA of --tls-client-ca (else
its own certificate chain) to verify the other member.
"""

from __future__ import annotations

import logging
import threading

import grpc

from dlfs import limits
from dlfs.proto import dlfs_pb2 as pb
from dlfs.proto import dlfs_pb2_grpc
from dlfs.server.auth import METADATA_KEY, SCHEME, load_tokens
from dlfs.server.config import ServerConfig

log = logging.getLogger(__name__)

_STATES = {pb.IngestOutcome.COMMITTED: "committed", pb.IngestOutcome.ABORTED: "aborted"}


class DecisionClient:
    """`(name, generation, address) -> "committed" | "aborted" | None` over gRPC.

    None: no decision yet, or the first member cannot be asked now (logged);
    the ingest machine asks again later.  One channel per member address, kept.
    Thread-safe.
    """

    def __init__(self, config: ServerConfig):
        self._metadata: tuple = ()
        if config.tokens_file:
            token = next(iter(load_tokens(config.tokens_file)))
            self._metadata = ((METADATA_KEY, SCHEME + token),)
        self._credentials = None
        if config.tls_cert:
            with open(config.tls_client_ca or config.tls_cert, "rb") as f:
                roots = f.read()
            with open(config.tls_cert, "rb") as f:
                chain = f.read()
            with open(config.tls_key, "rb") as f:
                key = f.read()
            self._credentials = grpc.ssl_channel_credentials(roots, key, chain)
        self._poll_s = config.in_doubt_poll_s
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()

    def __call__(self, name: str, generation: int, address: str) -> str | None:
        request = pb.IngestOutcomeRequest(dataset=name, generation=generation)
        try:
            reply = dlfs_pb2_grpc.DlfsStub(self._channel(address)).GetIngestOutcome(
                request, timeout=limits.decision_call_timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            log.warning("dataset %r generation %d waits for its outcome: %s does not answer "
                        "(%s); asking again in %g s", name, generation, address, exc.code(),
                        self._poll_s)
            return None
        return _STATES.get(reply.state)

    def _channel(self, address: str) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                if self._credentials is not None:
                    channel = grpc.secure_channel(address, self._credentials)
                else:
                    channel = grpc.insecure_channel(address)
                self._channels[address] = channel
            return channel

    def close(self) -> None:
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()
