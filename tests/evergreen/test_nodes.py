"""The node graph of an Evergreen session, rule by rule: fragments dedupe, complete out of
order, stop at the final seq; metadata only on seq 0; a node is inner or a leaf, inline or by
ref; limits, cycles and depth abort; output ids are fresh; waiting wakes on arrivals."""

from __future__ import annotations

import asyncio
from contextlib import AbstractContextManager

import pytest

from orchestratord.evergreen.nodes import (
    DEFAULT_MIMETYPE,
    ChunkPart,
    Fragment,
    Leaf,
    Limits,
    NodeStore,
    SessionAbort,
)


def chunk(
    node_id: str,
    data: bytes | None = b"",
    *,
    seq: int = 0,
    continued: bool = False,
    mimetype: str | None = "text/plain",
    role: str | None = None,
    ref: str | None = None,
) -> Fragment:
    """A leaf fragment; metadata only on seq 0 unless given otherwise."""
    if seq != 0 and mimetype == "text/plain":
        mimetype = None
    return Fragment(node_id, seq, continued, chunk=ChunkPart(mimetype, role, data, ref))


def inner(node_id: str, *children: str, seq: int = 0, continued: bool = False) -> Fragment:
    return Fragment(node_id, seq, continued, child_ids=children)


def aborts(code: str, *words: str) -> AbstractContextManager[pytest.ExceptionInfo[SessionAbort]]:
    return pytest.raises(SessionAbort, match=".*".join(["^" + code, *words]))


def test_a_repeated_seq_is_a_retry_the_first_copy_is_kept() -> None:
    store = NodeStore()
    assert store.add(chunk("a", b"first", continued=True))
    assert not store.add(chunk("a", b"second", continued=True))
    assert store.add(chunk("a", b"-end", seq=1))
    assert not store.add(chunk("a", b"late retry", seq=1))
    assert not store.add(chunk("a", b"retry after completion", continued=True))
    assert store.leaves("a") == [Leaf("a", "text/plain", "", b"first-end", None)]


def test_fragments_arriving_out_of_order_complete_when_every_seq_is_here() -> None:
    store = NodeStore()
    store.add(chunk("a", b"C", seq=2))
    assert not store.is_complete("a")
    store.add(chunk("a", b"A", continued=True, role="user"))
    assert not store.is_complete("a")
    assert store.missing("a") == ["a"]
    store.add(chunk("a", b"B", seq=1, continued=True))
    assert store.is_complete("a")
    assert store.missing("a") == []
    assert store.leaves("a") == [Leaf("a", "text/plain", "user", b"ABC", None)]


def test_children_are_appended_across_fragments_in_seq_order() -> None:
    store = NodeStore()
    store.add(inner("p", "c", "d", seq=1))
    store.add(inner("p", "a", "b", continued=True))
    for name in "abcd":
        store.add(chunk(name, name.encode()))
    assert [leaf.data for leaf in store.leaves("p")] == [b"a", b"b", b"c", b"d"]


def test_a_seq_after_the_final_one_aborts() -> None:
    store = NodeStore()
    store.add(chunk("a", b"x", continued=True))
    store.add(chunk("a", b"y", seq=1))
    with aborts("INVALID_ARGUMENT", "'a'", "seq 2", "final"):
        store.add(chunk("a", b"z", seq=2))


def test_a_final_fragment_before_a_higher_seq_that_arrived_first_aborts() -> None:
    store = NodeStore()
    store.add(chunk("a", b"z", seq=3, continued=True))
    with aborts("INVALID_ARGUMENT", "'a'", "seq 3", r"final fragment \(seq 1\)"):
        store.add(chunk("a", b"y", seq=1))


def test_a_second_final_fragment_aborts() -> None:
    store = NodeStore()
    store.add(chunk("a", b"z", seq=2))
    with aborts("INVALID_ARGUMENT", "'a'", "seq 1", "second final"):
        store.add(chunk("a", b"y", seq=1))


def test_metadata_on_a_seq_other_than_0_aborts() -> None:
    store = NodeStore()
    store.add(chunk("a", b"x", continued=True))
    with aborts("INVALID_ARGUMENT", "'a'", "seq 1", "metadata"):
        store.add(Fragment("a", 1, False, chunk=ChunkPart("text/plain", None, b"y", None)))
    with aborts("INVALID_ARGUMENT", "'b'", "seq 1", "metadata"):
        store.add(Fragment("b", 1, False, chunk=ChunkPart(None, "user", b"y", None)))


def test_a_leaf_needs_metadata_on_seq_0() -> None:
    store = NodeStore()
    with aborts("INVALID_ARGUMENT", "'a'", "seq 0", "metadata"):
        store.add(chunk("a", b"x", mimetype=None))
    # seq 0 without a chunk, then a chunk: seq 0 held no metadata, whichever came first
    store.add(Fragment("b", 0, True))
    with aborts("INVALID_ARGUMENT", "'b'", "seq 1", "metadata"):
        store.add(chunk("b", b"x", seq=1))
    store.add(chunk("c", b"x", seq=1))
    with aborts("INVALID_ARGUMENT", "'c'", "seq 0", "metadata"):
        store.add(Fragment("c", 0, True))


def test_an_empty_mimetype_reads_as_the_default_and_an_empty_leaf_is_valid() -> None:
    store = NodeStore()
    store.add(chunk("a", b"x", mimetype=""))
    store.add(chunk("eot", None, mimetype="application/x-protobuf; type=EndOfTurn"))
    assert store.leaves("a")[0].mimetype == DEFAULT_MIMETYPE == "application/octet-stream"
    assert store.leaves("eot") == [
        Leaf("eot", "application/x-protobuf; type=EndOfTurn", "", b"", None)
    ]


def test_children_and_a_chunk_in_one_fragment_abort() -> None:
    store = NodeStore()
    both = Fragment("a", 0, False, child_ids=("b",), chunk=ChunkPart("text/plain", None, b"", None))
    with aborts("INVALID_ARGUMENT", "'a'", "seq 0", "inner or a leaf"):
        store.add(both)


def test_children_and_a_chunk_across_fragments_abort_in_either_order() -> None:
    store = NodeStore()
    store.add(inner("a", "x", continued=True))
    with aborts("INVALID_ARGUMENT", "'a'", "seq 1", "inner or a leaf"):
        store.add(chunk("a", b"y", seq=1))
    store.add(chunk("b", b"y", continued=True))
    with aborts("INVALID_ARGUMENT", "'b'", "seq 1", "inner or a leaf"):
        store.add(inner("b", "x", seq=1))


def test_a_ref_leaf_keeps_its_refs_for_the_caller() -> None:
    store = NodeStore()
    store.add(chunk("v", None, ref="file://part1", mimetype="video/mp4", continued=True))
    store.add(chunk("v", None, ref="file://part2", seq=1))
    [leaf] = store.leaves("v")
    assert (leaf.mimetype, leaf.data, leaf.ref) == ("video/mp4", b"", "file://part1")
    assert leaf.refs == ("file://part1", "file://part2")
    assert Leaf("w", "text/plain", "", b"", "file://w").refs == ("file://w",)


def test_a_ref_and_data_in_one_node_abort() -> None:
    store = NodeStore()
    store.add(chunk("a", b"inline", continued=True))
    with aborts("INVALID_ARGUMENT", "'a'", "seq 1", "data and refs"):
        store.add(chunk("a", None, ref="file://x", seq=1))
    store.add(chunk("b", None, ref="file://x", continued=True))
    with aborts("INVALID_ARGUMENT", "'b'", "seq 1", "data and refs"):
        store.add(chunk("b", b"inline", seq=1))
    with aborts("INVALID_ARGUMENT", "'c'", "seq 0", "both data and a ref"):
        store.add(chunk("c", b"inline", ref="file://x"))


def test_more_nodes_than_max_nodes_abort() -> None:
    store = NodeStore(Limits(max_nodes=2))
    store.add(inner("root", "a", "b", "c"))  # named children are not nodes until they arrive
    store.add(chunk("a", b"x"))
    with aborts("RESOURCE_EXHAUSTED", "'b'", r"max_nodes \(2\)"):
        store.add(chunk("b", b"x"))
    assert not store.add(chunk("a", b"x"))  # a retry adds no node
    with aborts("RESOURCE_EXHAUSTED", "'out'", r"max_nodes \(2\)"):
        store.claim_output("out")


def test_more_payload_bytes_than_max_bytes_abort() -> None:
    # a node's id, its mimetype and its payload count: "a" + "text/plain" + 5 = 16
    store = NodeStore(Limits(max_bytes=30))
    store.add(chunk("a", b"12345", continued=True))
    store.add(chunk("b", b"1"))  # 1 + 10 + 1: 28 held
    with aborts("RESOURCE_EXHAUSTED", "'a'", "seq 1", r"max_bytes \(30\)"):
        store.add(chunk("a", b"123", seq=1))
    store.add(chunk("a", b"12", seq=1))  # exactly at the limit
    assert store.byte_count == 30
    with aborts("RESOURCE_EXHAUSTED", "'out'", r"max_bytes \(30\)"):
        store.add_output("out", "text/plain", "model", b"")  # its id counts


def test_ids_count_in_max_bytes_each_child_id_each_time() -> None:
    store = NodeStore(Limits(max_bytes=100))
    store.add(inner("p", "c" * 40, "c" * 40))  # 1 + 80
    assert store.byte_count == 81
    with aborts("RESOURCE_EXHAUSTED", "'q'", r"max_bytes \(100\)"):
        store.add(inner("q", "d" * 20))
    store.claim_output("o" * 19)
    assert store.byte_count == 100
    with aborts("RESOURCE_EXHAUSTED", "action 'GENERATE'", r"max_bytes \(100\)"):
        store.charge(1, "action 'GENERATE'")


@pytest.mark.parametrize(
    "fragment",
    [
        chunk("x" * 65, b"1"),
        inner("p", "ok", "c" * 65),
        chunk("a", b"1", mimetype="t" * 65),
        chunk("a", b"1", role="r" * 65),
    ],
    ids=["node id", "child id", "mimetype", "role"],
)
def test_an_id_longer_than_max_id_bytes_aborts_before_it_is_held(fragment: Fragment) -> None:
    store = NodeStore(Limits(max_id_bytes=64))
    with aborts("RESOURCE_EXHAUSTED", r"longer than max_id_bytes \(64\): 65 bytes"):
        store.add(fragment)
    assert store.node_count == 0 and store.byte_count == 0
    with aborts("RESOURCE_EXHAUSTED", "output id", r"max_id_bytes \(64\)"):
        store.claim_output("é" * 33)  # 66 bytes in UTF-8
    store.add(chunk("a" * 64, b"1"))  # at the limit


def test_more_fragments_than_max_fragments_per_node_abort() -> None:
    store = NodeStore(Limits(max_fragments_per_node=3))
    for seq in range(3):
        store.add(chunk("a", b"x", seq=seq, continued=True))
    with aborts("RESOURCE_EXHAUSTED", "'a'", "seq 3", r"max_fragments_per_node \(3\)"):
        store.add(chunk("a", b"x", seq=3))
    with aborts("RESOURCE_EXHAUSTED", "'b'", "seq 1000000", r"max_fragments_per_node \(3\)"):
        store.add(chunk("b", b"x", seq=1_000_000))


def test_more_child_ids_than_max_child_ids_abort() -> None:
    store = NodeStore(Limits(max_child_ids=3))
    store.add(inner("p", "a", "a", continued=True))
    with aborts("RESOURCE_EXHAUSTED", "'p'", "seq 1", r"max_child_ids \(3\)"):
        store.add(inner("p", "b", "c", seq=1))


def test_a_cycle_aborts_when_flattened() -> None:
    store = NodeStore()
    store.add(inner("root", "a"))
    store.add(inner("a", "leaf", "b"))
    store.add(inner("b", "root"))
    store.add(chunk("leaf", b"x"))
    assert not store.is_complete("root")
    assert store.missing("root") == []
    with aborts("INVALID_ARGUMENT", "'root'", "cycle", "root -> a -> b -> root"):
        store.leaves("root")
    with aborts("INVALID_ARGUMENT", "cycle", "b -> root -> a -> b"):
        store.leaves("b")


def test_a_node_naming_itself_aborts_at_once() -> None:
    with aborts("INVALID_ARGUMENT", "'a'", "seq 0", "itself"):
        NodeStore().add(inner("a", "b", "a"))


async def test_waiting_on_a_cycle_aborts_once_every_node_is_here() -> None:
    store = NodeStore()
    store.add(inner("a", "b"))
    waiter = asyncio.create_task(store.wait_complete(["a"], timeout_s=30))
    await asyncio.sleep(0)
    store.add(inner("b", "a"))
    with aborts("INVALID_ARGUMENT", "cycle", "a -> b -> a"):
        await waiter


def test_nesting_deeper_than_max_depth_aborts() -> None:
    store = NodeStore(Limits(max_depth=2))
    store.add(inner("n0", "n1"))
    store.add(inner("n1", "n2"))
    store.add(chunk("n2", b"deep"))
    assert [leaf.node_id for leaf in store.leaves("n0")] == ["n2"]  # depth 2: allowed
    store.add(inner("top", "n0"))
    with aborts("RESOURCE_EXHAUSTED", "'n2'", r"max_depth \(2\)", "'top'"):
        store.leaves("top")


def test_a_deep_chain_completes_and_flattens_without_recursion() -> None:
    depth = 5_000
    store = NodeStore(Limits(max_depth=depth))
    store.add(chunk(f"n{depth}", b"bottom"))
    for level in range(depth):
        store.add(inner(f"n{level}", f"n{level + 1}"))
    assert store.is_complete("n0")
    assert [leaf.data for leaf in store.leaves("n0")] == [b"bottom"]


def test_leaves_come_depth_first_with_children_in_order() -> None:
    store = NodeStore()
    store.add(inner("root", "intro", "section", "shared", "outro"))
    store.add(inner("section", "s1", "sub", "s2"))
    store.add(inner("sub", "shared", "deep"))
    store.add(inner("empty"))
    store.add(inner("shared", "empty", "x"))
    for name in ("intro", "s1", "deep", "s2", "x", "outro"):
        store.add(chunk(name, name.encode()))
    assert store.is_complete("root")
    order = [leaf.node_id for leaf in store.leaves("root")]
    assert order == ["intro", "s1", "x", "deep", "s2", "x", "outro"]


def test_flattening_a_node_that_is_not_here_yet_is_refused() -> None:
    store = NodeStore()
    store.add(inner("root", "late"))
    with aborts("FAILED_PRECONDITION", "'late'", "not complete"):
        store.leaves("root")


def test_missing_lists_the_nodes_not_received_sorted() -> None:
    store = NodeStore()
    store.add(inner("root", "z", "half", "done", continued=True))
    store.add(chunk("half", b"x", continued=True))
    store.add(chunk("done", b"x"))
    assert store.missing("root") == ["half", "root", "z"]
    assert store.missing("nowhere") == ["nowhere"]
    store.add(inner("root", seq=1))
    assert store.missing("root") == ["half", "z"]


def test_an_output_id_is_claimed_once() -> None:
    store = NodeStore()
    store.claim_output("out")
    with aborts("INVALID_ARGUMENT", "output id already used", "'out'"):
        store.claim_output("out")
    store.add(chunk("prompt", b"hi"))
    with aborts("INVALID_ARGUMENT", "output id already used", "'prompt'"):
        store.claim_output("prompt")
    store.add_output("done", "text/plain", "model", b"ok")
    with aborts("INVALID_ARGUMENT", "output id already used", "'done'"):
        store.claim_output("done")
    with aborts("INVALID_ARGUMENT", "output id already used", "'prompt'"):
        store.add_output("prompt", "text/plain", "model", b"ok")


def test_a_client_fragment_for_an_output_id_aborts() -> None:
    store = NodeStore()
    store.claim_output("claimed")
    store.add_output("produced", "text/plain", "model", b"ok")
    with aborts("INVALID_ARGUMENT", "'claimed'", "seq 0", "output"):
        store.add(chunk("claimed", b"mine"))
    with aborts("INVALID_ARGUMENT", "'produced'", "seq 0", "output"):
        store.add(chunk("produced", b"ok"))


def test_an_output_completes_the_nodes_that_name_it() -> None:
    store = NodeStore()
    store.add(chunk("q1", b"first question"))
    store.claim_output("r1")
    store.add(inner("prompt2", "q1", "r1"))  # a client may name an output before it exists
    assert store.missing("prompt2") == ["r1"]
    store.add_output("r1", "text/plain", "model", b"answer")
    assert store.is_complete("prompt2")
    assert store.leaves("prompt2") == [
        Leaf("q1", "text/plain", "", b"first question", None),
        Leaf("r1", "text/plain", "model", b"answer", None),
    ]


async def test_wait_complete_returns_when_a_late_child_arrives() -> None:
    store = NodeStore()
    store.add(inner("prompt", "question", "video"))
    store.add(chunk("question", b"what happens?"))
    waiter = asyncio.create_task(store.wait_complete(["prompt", "question"], timeout_s=30))
    await asyncio.sleep(0)
    store.add(chunk("video", b"frame1", mimetype="video/mp4", continued=True))
    await asyncio.sleep(0)
    assert not waiter.done()
    store.add(chunk("video", b"frame2", seq=1))
    await waiter
    assert [leaf.node_id for leaf in store.leaves("prompt")] == ["question", "video"]


async def test_wait_complete_returns_at_once_when_complete() -> None:
    store = NodeStore()
    store.add(chunk("a", b"x"))
    await store.wait_complete(["a", "a"], timeout_s=0)


async def test_wait_complete_times_out_naming_the_missing_ids() -> None:
    store = NodeStore()
    store.add(inner("prompt", "child_b", "child_a", "here"))
    store.add(chunk("here", b"x"))
    with aborts("DEADLINE_EXCEEDED", "'prompt'", "missing 'child_a', 'child_b'$"):
        await store.wait_complete(["prompt"], timeout_s=0.05)
    with aborts("DEADLINE_EXCEEDED", "'never_sent'"):
        await store.wait_complete(["never_sent"], timeout_s=0.05)


def test_a_leaf_streamed_in_many_fragments_in_reverse_assembles_in_seq_order() -> None:
    store = NodeStore()
    count = 20_000
    for seq in reversed(range(count)):
        store.add(chunk("big", b"%d," % seq, seq=seq, continued=seq < count - 1))
    [leaf] = store.leaves("big")
    assert leaf.data == b"".join(b"%d," % seq for seq in range(count))
    assert store.byte_count == len(leaf.data) + len("big") + len("text/plain")
