"""Read requests: the rules for keys, checked before anything is sent, and ids kept as
one int64 array (no copy of an int64 array, no Python list on the way)."""

from __future__ import annotations

import numpy as np
import pytest

from dlfs.client.transport import grpc_messages
from dlfs.client.transport.read_requests import batch_request, prefetch_request, range_request
from dlfs.errors import InvalidArgument

MIX = "either integer sample ids or string paths, not a mix or other types"


def test_an_int64_array_of_ids_is_taken_as_it_is():
    ids = np.array([5, 1, 5, 30], dtype=np.int64)
    request = batch_request("ds", ids, prefetch=np.array([7, 8]))
    assert request.ids is ids and request.paths is None and request.size == 4
    assert request.prefetch_ids.dtype == np.int64 and request.prefetch_ids.tolist() == [7, 8]


@pytest.mark.parametrize("keys", [[3, 1, 3], (3, 1, 3), range(3, 0, -2),
                                  [np.int32(3), np.uint8(1), 3],
                                  np.array([3, 1, 3], dtype=np.uint16)])
def test_ids_of_any_integer_kind_become_one_int64_array(keys):
    request = batch_request("ds", keys)
    assert request.ids.dtype == np.int64 and request.ids.ndim == 1
    assert request.ids.tolist() == [int(k) for k in keys]


def test_paths_stay_paths():
    request = batch_request("ds", ["a/b", "c"])
    assert request.ids is None and request.paths == ("a/b", "c") and request.size == 2


def test_no_keys_are_an_empty_batch():
    for keys in ([], (), np.empty(0, np.int64), np.empty((0, 3), np.int32)):
        request = batch_request("ds", keys)
        assert request.size == 0 and request.ids.dtype == np.int64


@pytest.mark.parametrize("keys,expected", [
    ([1, "a"], "expected integer sample ids"),
    (["a", 1], "expected string paths"),
    ([1.0], "expected integer sample ids"),
    ([1, 2.5], "expected integer sample ids"),
    ([True, 1], "expected integer sample ids"),  # an int to Python, never a sample id
    ([1, None], "expected integer sample ids"),
    ([np.True_], "expected integer sample ids"),
    (np.array([[1, 2], [3, 4]]), "expected integer sample ids"),
])
def test_a_mix_or_another_type_is_refused(keys, expected):
    with pytest.raises(InvalidArgument, match=f"{MIX} \\({expected}\\)"):
        batch_request("ds", keys)


@pytest.mark.parametrize("keys", [[2**63], [1, 2**64], np.array([2**63], dtype=np.uint64)])
def test_ids_past_a_signed_64_bit_integer_are_refused(keys):
    with pytest.raises(InvalidArgument, match="sample ids must fit in a signed 64-bit integer"):
        batch_request("ds", keys)


def test_an_array_that_is_not_of_integers_is_refused():
    with pytest.raises(InvalidArgument, match="sample ids must be integers, got an array of "
                                              "float64"):
        batch_request("ds", np.array([1.0, 2.0]))


def test_prefetch_hints_ride_by_id_only():
    with pytest.raises(InvalidArgument, match=f"{MIX} \\(expected string paths\\)"):
        batch_request("ds", [1], prefetch=["a"])
    assert prefetch_request("ds", ["a"]).paths == ("a",)


def test_ranges_name_one_sample_with_non_negative_bounds():
    assert range_request("ds", 7, 10, 5, verify=True).sample_id == 7
    by_path = range_request("ds", "a/b", 0, 0, verify=False, generation=3)
    assert (by_path.path, by_path.sample_id, by_path.verify, by_path.generation) == \
        ("a/b", None, False, 3)
    with pytest.raises(InvalidArgument, match="offset -1 and length 0 must not be negative"):
        range_request("ds", 7, -1, 0, verify=True)
    with pytest.raises(InvalidArgument, match="sample id -2 is negative"):
        range_request("ds", -2, 0, 0, verify=True)
    with pytest.raises(InvalidArgument, match="not True"):
        range_request("ds", True, 0, 0, verify=True)


def test_the_grpc_transport_sends_what_the_request_says():
    message = grpc_messages.batch_message(batch_request("ds", np.array([4, 2]), verify=False,
                                                        prefetch=[9], generation=12))
    assert (message.dataset, list(message.ids), list(message.paths), message.skip_verify,
            list(message.prefetch_ids), message.generation) == ("ds", [4, 2], [], True, [9], 12)
    message = grpc_messages.range_message(range_request("ds", "p", 3, 4, verify=True))
    assert (message.path, message.id, message.offset, message.length, message.skip_verify) == \
        ("p", 0, 3, 4, False)
