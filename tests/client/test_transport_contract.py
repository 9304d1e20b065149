"""Every transport answers its contract (`dlfs.client.transport.contract`): each method
of the protocol it implements, with the same parameters, and the attributes it names."""

from __future__ import annotations

import inspect

import pytest

from dlfs.client.cluster.router import ClusterRouter
from dlfs.client.transport import contract
from dlfs.client.transport.datapath_transport import DataPathTransport
from dlfs.client.transport.direct_transport import DirectTransport
from dlfs.client.transport.grpc_control import GrpcControl
from dlfs.client.transport.grpc_transport import GrpcTransport


def _methods(protocol) -> dict:
    found = {}
    for cls in reversed(protocol.__mro__):
        if cls is object or cls.__name__ in ("Protocol", "Generic"):
            continue
        found.update({name: value for name, value in vars(cls).items()
                      if inspect.isfunction(value) and not name.startswith("_")})
    return found


def _attributes(protocol) -> set[str]:
    names: set[str] = set()
    for cls in protocol.__mro__:
        names.update(getattr(cls, "__annotations__", {}))
    return names


def _parameters(function) -> list[tuple[str, object, bool]]:
    """(name, kind, has a default) of each parameter but self."""
    return [(p.name, p.kind, p.default is not inspect.Parameter.empty)
            for p in list(inspect.signature(function).parameters.values())[1:]]


IMPLEMENTATIONS = [
    (contract.DaemonControl, GrpcControl),
    (contract.DaemonTransport, GrpcTransport),
    (contract.DaemonTransport, DataPathTransport),
    (contract.DaemonTransport, DirectTransport),
    (contract.Transport, ClusterRouter),
]


def test_the_protocols_have_methods_to_check():
    assert {"get_batch", "read_range", "each", "call_any"} <= set(_methods(contract.Transport))
    assert {"control", "data_path"} <= _attributes(contract.DaemonTransport) | set(
        _methods(contract.DaemonTransport))
    assert {"ingest", "ingest_progress", "delete_dataset"} <= set(
        _methods(contract.DaemonControl))


@pytest.mark.parametrize("protocol,implementation", IMPLEMENTATIONS,
                         ids=[f"{i.__name__}-{p.__name__}" for p, i in IMPLEMENTATIONS])
def test_each_transport_answers_every_method_of_its_protocol(protocol, implementation):
    for name, method in _methods(protocol).items():
        mine = getattr(implementation, name, None)
        assert mine is not None, f"{implementation.__name__} lacks {name}"
        assert _parameters(mine) == _parameters(method), f"{implementation.__name__}.{name}"


@pytest.mark.parametrize("protocol,implementation", IMPLEMENTATIONS,
                         ids=[f"{i.__name__}-{p.__name__}" for p, i in IMPLEMENTATIONS])
def test_each_transport_sets_the_attributes_its_protocol_names(protocol, implementation):
    source = inspect.getsource(implementation.__init__)
    for name in _attributes(protocol):
        assert f"self.{name} =" in source or f"self.{name}: " in source, \
            f"{implementation.__name__} sets no {name}"
