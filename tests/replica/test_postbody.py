"""What a POST body asks for, read once (:mod:`mcp_epoch._internal.postbody`)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from mcp_epoch._internal.postbody import read_post


def body(obj: object) -> bytes:
    return json.dumps(obj).encode()


def test_requests_are_named_as_the_sdk_names_their_streams() -> None:
    call = read_post(body({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {}}))
    assert (call.calls, call.work, call.single_id) == ({"7": 7}, True, 7)
    ping = {"jsonrpc": "2.0", "id": "p", "method": "ping"}
    listing = {"jsonrpc": "2.0", "id": 8, "method": "tools/list"}
    batch = read_post(body([ping, listing]))
    assert (batch.calls, batch.work, batch.single_id) == ({"p": "p", "8": 8}, False, None)


def test_cancellations_and_answers_start_no_call() -> None:
    answer = {"jsonrpc": "2.0", "id": 3, "result": {}}  # the client answering the server
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}}
    read = read_post(body([answer, cancel]))
    assert (read.calls, read.cancelled, read.work) == ({}, ("7",), False)


def test_what_is_not_json_rpc_asks_for_nothing() -> None:
    for raw in (b"not json", b"\xff\xfe", b"[1, null]", body({"id": True, "method": "tools/call"})):
        read = read_post(raw)
        assert (read.calls, read.cancelled, read.work, read.single_id) == ({}, (), False, None)


def test_a_hostile_deeply_nested_body_is_not_json_rpc_and_raises_nothing() -> None:
    # json.loads raised RecursionError out of the request for this; the SDK answers it with
    # its own parse error, and the guard must let it get that far.
    deep = b"[" * 100_000 + b"]" * 100_000
    assert read_post(deep).calls == {} and not read_post(deep).work
    nested = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": ' + deep + b"}"
    assert read_post(nested).calls == {}


def test_log_level_and_the_revision_an_initialize_asks_for() -> None:
    level = {"jsonrpc": "2.0", "id": 1, "method": "logging/setLevel", "params": {"level": "debug"}}
    assert read_post(body(level)).log_level == "debug"
    flood = dict(level, params={"level": "x" * 33})
    assert read_post(body(flood)).log_level is None
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}},
    }
    assert read_post(body(init)).asked_version == "2025-11-25"
    assert read_post(body(dict(init, params={"protocolVersion": 5}))).asked_version is None


def test_a_body_equal_to_the_last_reads_the_same_and_another_anew() -> None:
    first = body({"jsonrpc": "2.0", "id": 1, "method": "ping"})
    again = bytes(bytearray(first))  # equal, not the same object
    assert again is not first
    assert read_post(again) is read_post(first)
    other = read_post(body({"jsonrpc": "2.0", "id": 2, "method": "ping"}))
    assert other.calls == {"2": 2}
    assert read_post(first).calls == {"1": 1}


@given(
    st.fixed_dictionaries(
        {"jsonrpc": st.just("2.0")},
        optional={
            "id": st.one_of(st.integers(), st.text(max_size=4), st.booleans(), st.none()),
            "method": st.one_of(
                st.sampled_from(
                    [
                        "tools/call",
                        "tools/list",
                        "ping",
                        "notifications/cancelled",
                        "notifications/initialized",
                        "logging/setLevel",
                        "initialize",
                    ]
                ),
                st.integers(),
            ),
            "params": st.one_of(
                st.none(),
                st.fixed_dictionaries(
                    {},
                    optional={
                        "requestId": st.one_of(st.integers(), st.text(max_size=4)),
                        "level": st.text(max_size=40),
                        "protocolVersion": st.one_of(st.text(max_size=12), st.integers()),
                    },
                ),
            ),
            "result": st.just({}),
        },
    )
)
def test_a_single_message_reads_as_it_does_in_a_batch_of_one(message: dict[str, object]) -> None:
    # A single message has a shorter path than a batch: both must read it the same, all but
    # the body and the id an error answer echoes (a batch has none).
    single, batch = read_post(body(message)), read_post(body([message]))
    assert single._replace(body=b"", single_id=None) == batch._replace(body=b"", single_id=None)
    echoed = single_id(message.get("id")) if "method" in message else None
    assert single.single_id == echoed


def single_id(value: object) -> object:
    return value if type(value) in (int, str) else None
