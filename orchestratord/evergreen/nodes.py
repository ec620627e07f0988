"""A session's node graph, assembled from fragments under the Evergreen protocol's rules.

Pure: it takes plain dataclasses (the gRPC layer converts ``NodeFragment`` messages into
:class:`Fragment`) and raises :class:`SessionAbort`, carrying the name of the gRPC status code
the session ends with and a message naming what is wrong (the node id, the seq, the limit).

The rules (docs of the protocol, "Ordering", "Boundaries", "Mime type", "Chunk payloads"):

- A node arrives as fragments that share its id, numbered by ``seq`` from 0; the one with
  ``continued`` unset is the last. Fragments may arrive in any order: a node is received when
  every seq from 0 to the final one is here. A repeated (id, seq) is a retry: the first copy is
  kept and the others dropped without an error. A seq after the final one aborts the session,
  whichever of the two arrived first, and so does a second final fragment.
- A node is either inner (its fragments' ``child_ids``, appended in seq order) or a leaf (its
  fragments' chunk payloads, concatenated in seq order); a node with both aborts. Children may
  name nodes that have not arrived yet: the parent is complete once they and their own
  descendants are.
- Chunk metadata (mimetype, role) is required on seq 0 of a leaf and forbidden on any other
  seq. A metadata whose mimetype is empty reads as :data:`DEFAULT_MIMETYPE` (the protocol names
  no default); a missing role reads as "".
- A leaf's payload is inline ``data`` or external ``ref`` URIs, never both. Refs are kept for
  the caller to resolve; a leaf in several ref fragments stands for their contents in order
  (``Leaf.refs``).
- Output ids are fresh: an action's output id must not be a node (or another action's output)
  already, and clients never send fragments for an output id.
- Nesting is bounded (``Limits.max_depth``) and so is what a session holds (:class:`Limits`):
  ids count in ``max_bytes`` as payloads do (a node's id once, each ``child_ids`` entry, the
  strings of its chunk metadata), and one id is at most ``max_id_bytes``.

Costs: a fragment costs O(1) plus its payload and its ids (an out-of-order fragment is
held until the ones before it arrive; a leaf's payload is joined once, when it completes).
Completion is tracked incrementally (each node counts its children that are not complete yet),
so :meth:`NodeStore.is_complete` is O(1), and :meth:`NodeStore.wait_complete` sleeps on an
event that is set only when a node completes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

DEFAULT_MIMETYPE = "application/octet-stream"
"""A leaf's mimetype when its metadata leaves it empty."""

_SHOWN_IDS = 20  # ids listed in one error message; the rest are counted

_CLIENT = "client"  # received from the client in fragments
_CLAIMED = "claimed"  # an action's output id, not produced yet
_OUTPUT = "output"  # produced by the server (add_output)


class SessionAbort(Exception):
    """The session ends with the gRPC status ``code`` (its name, e.g. "INVALID_ARGUMENT")."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def _invalid(message: str) -> SessionAbort:
    return SessionAbort("INVALID_ARGUMENT", message)


def _exhausted(message: str) -> SessionAbort:
    return SessionAbort("RESOURCE_EXHAUSTED", message)


def shown(value: str, limit: int = 40) -> str:
    """``value`` quoted for a message, cut to ``limit`` characters."""
    return repr(value) if len(value) <= limit else f"{value[:limit]!r}..."


def _names(ids: Sequence[str]) -> str:
    shown = ", ".join(repr(i) for i in ids[:_SHOWN_IDS])
    more = len(ids) - _SHOWN_IDS
    return f"{shown} and {more} more" if more > 0 else shown


@dataclass(frozen=True)
class ChunkPart:
    """One fragment's chunk. ``mimetype`` and ``role`` are None when the fragment carries no
    metadata; ``data`` and ``ref`` are None when that payload is absent."""

    mimetype: str | None
    role: str | None
    data: bytes | None
    ref: str | None

    @property
    def has_metadata(self) -> bool:
        return self.mimetype is not None or self.role is not None


@dataclass(frozen=True)
class Fragment:
    """One ``NodeFragment``: ``chunk`` is None when it has no ``chunk_fragment``."""

    id: str
    seq: int
    continued: bool
    child_ids: tuple[str, ...] = ()
    chunk: ChunkPart | None = None


@dataclass(frozen=True)
class Leaf:
    """An assembled leaf node. ``data`` is its inline payload (b"" for a ref leaf); ``refs``
    are its external payloads in seq order (their contents concatenated make the leaf), and
    ``ref`` is the first of them (None for an inline leaf)."""

    node_id: str
    mimetype: str
    role: str
    data: bytes
    ref: str | None
    refs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.refs and self.ref is not None:
            object.__setattr__(self, "refs", (self.ref,))
        elif self.refs and self.ref is None:
            object.__setattr__(self, "ref", self.refs[0])
        elif self.refs and self.ref != self.refs[0]:
            raise ValueError(f"leaf {self.node_id!r}: ref must be the first of refs")


@dataclass(frozen=True)
class Limits:
    """What one session may hold.

    ``max_nodes``: nodes received, claimed as outputs or produced (an id only named as a child
    counts once its node arrives); also the most nodes one flattening may visit.
    ``max_bytes``: the bytes the client's strings take over the session, in UTF-8: chunk
    payloads (inline data, ref URIs), node ids (once per node), ``child_ids`` entries (each
    one), chunk metadata (mimetype, role), and what the caller charges
    (:meth:`NodeStore.charge`: actions); also the most inline bytes one flattening may yield
    (a node shared by several parents counts each time). ``max_id_bytes``: the longest id
    (or name, mimetype, role). ``max_depth``: edges from the flattened root to its deepest
    node (a root's children are at depth 1). ``max_fragments_per_node``: fragments of one
    node, so seq
    must stay below it. ``max_child_ids``: ``child_ids`` entries over the session.
    """

    max_nodes: int = 10_000
    max_bytes: int = 64 << 20
    max_depth: int = 64
    max_fragments_per_node: int = 100_000
    max_child_ids: int = 1_000_000
    max_id_bytes: int = 1024

    def __post_init__(self) -> None:
        for name in (
            "max_nodes",
            "max_bytes",
            "max_depth",
            "max_fragments_per_node",
            "max_child_ids",
            "max_id_bytes",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")


class _Node:
    """One node's state while it arrives, and once it has."""

    __slots__ = (
        "blockers",
        "children",
        "deep_complete",
        "final_seq",
        "has_data",
        "has_metadata",
        "has_ref",
        "inner",
        "is_leaf",
        "leaf",
        "max_seq",
        "mimetype",
        "next_seq",
        "origin",
        "parts",
        "pending",
        "refs",
        "role",
        "self_complete",
        "seq0_seen",
    )

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.next_seq = 0  # every seq below it is here and applied
        self.final_seq: int | None = None
        self.max_seq = -1
        self.pending: dict[int, Fragment] = {}  # arrived ahead of next_seq
        self.children: list[str] = []
        self.parts: list[bytes] = []
        self.refs: list[str] = []
        self.inner = False  # a fragment named children
        self.is_leaf = False  # a fragment carried a chunk
        self.has_data = False
        self.has_ref = False
        self.seq0_seen = False
        self.has_metadata = False
        self.mimetype = ""
        self.role = ""
        self.self_complete = False  # received to its final fragment (or produced)
        self.deep_complete = False  # it and every descendant
        self.blockers = 0  # children not deep-complete, once self_complete
        self.leaf: Leaf | None = None  # the assembled leaf, once self_complete


class NodeStore:
    """The nodes of one session: fragments in, assembled leaves out."""

    def __init__(self, limits: Limits = Limits()) -> None:
        self.limits = limits
        self._nodes: dict[str, _Node] = {}
        self._parents: dict[str, list[str]] = {}  # child id -> parent ids, once per edge
        self._unreceived: set[str] = set()  # ids named as children, not a node yet
        self._incomplete = 0  # nodes that are not self-complete
        self._bytes = 0
        self._child_ids = 0
        self._changed: asyncio.Event | None = None  # set when a node completes

    def __contains__(self, node_id: object) -> bool:
        """Whether the id is a node: received (in part), claimed as an output, or produced."""
        return node_id in self._nodes

    @property
    def node_count(self) -> int:
        return len(self._nodes)

    @property
    def byte_count(self) -> int:
        return self._bytes

    # -- fragments in ------------------------------------------------------------------

    def add(self, fragment: Fragment) -> bool:
        """Take one client fragment; False when it repeats an (id, seq) already here (the
        first copy is kept). Raises :class:`SessionAbort` when it breaks a rule or a limit;
        the store is left as it was then."""
        nid, seq = fragment.id, fragment.seq
        if not nid:
            raise _invalid(f"a node fragment (seq {seq}) has an empty id")
        self._check_strings(fragment)
        if seq < 0:
            raise _invalid(f"node {nid!r} seq {seq}: seq must not be negative")
        node = self._nodes.get(nid)
        if node is not None:
            if node.origin != _CLIENT:
                raise _invalid(
                    f"node {nid!r} seq {seq}: the id is an action's output; "
                    "a client cannot send fragments for it"
                )
            if seq < node.next_seq or seq in node.pending:
                return False
            if node.final_seq is not None:
                if seq > node.final_seq:
                    raise _invalid(
                        f"node {nid!r} seq {seq}: after the node's final fragment "
                        f"(seq {node.final_seq})"
                    )
                if not fragment.continued:
                    raise _invalid(
                        f"node {nid!r} seq {seq}: a second final fragment "
                        f"(seq {node.final_seq} was final)"
                    )
            elif not fragment.continued and node.max_seq > seq:
                raise _invalid(
                    f"node {nid!r} seq {node.max_seq}: after the node's final fragment (seq {seq})"
                )
        limit = self.limits.max_fragments_per_node
        if seq >= limit:
            raise _exhausted(
                f"node {nid!r} seq {seq}: more fragments than max_fragments_per_node ({limit})"
            )
        self._check_shape(node, fragment)
        cost = self._cost(node, fragment)
        self._check_limits(node, fragment, cost)

        if node is None:
            node = self._new_node(nid, _CLIENT)
        children = fragment.child_ids
        for child in children:
            self._parents.setdefault(child, []).append(nid)
            if child not in self._nodes:
                self._unreceived.add(child)
        self._child_ids += len(children)
        self._bytes += cost
        chunk = fragment.chunk
        if children:
            node.inner = True
        if chunk is not None:
            node.is_leaf = True
            if chunk.data is not None:
                node.has_data = True
            if chunk.ref is not None:
                node.has_ref = True
        if seq == 0:
            node.seq0_seen = True
            if chunk is not None and chunk.has_metadata:
                node.has_metadata = True
                node.mimetype = chunk.mimetype or ""
                node.role = chunk.role or ""
        if not fragment.continued:
            node.final_seq = seq
        node.max_seq = max(node.max_seq, seq)

        if seq == node.next_seq:
            self._apply(node, fragment)
            node.next_seq += 1
            while node.pending:
                later = node.pending.pop(node.next_seq, None)
                if later is None:
                    break
                self._apply(node, later)
                node.next_seq += 1
        else:
            node.pending[seq] = fragment
        if node.final_seq is not None and node.next_seq > node.final_seq:
            self._finish(nid, node)
        return True

    def _check_shape(self, node: _Node | None, fragment: Fragment) -> None:
        nid, seq, chunk = fragment.id, fragment.seq, fragment.chunk
        for child in fragment.child_ids:
            if not child:
                raise _invalid(f"node {nid!r} seq {seq}: a child id is empty")
            if child == nid:
                raise _invalid(f"node {nid!r} seq {seq}: the node names itself as a child (cycle)")
        if chunk is not None:
            if chunk.has_metadata and seq != 0:
                raise _invalid(
                    f"node {nid!r} seq {seq}: chunk metadata on a fragment other than seq 0"
                )
            if chunk.data is not None and chunk.ref is not None:
                raise _invalid(f"node {nid!r} seq {seq}: a chunk with both data and a ref")
            if fragment.child_ids:
                raise _invalid(
                    f"node {nid!r} seq {seq}: both child_ids and a chunk "
                    "(a node is either inner or a leaf)"
                )
            if node is not None:
                if node.inner:
                    raise _invalid(
                        f"node {nid!r} seq {seq}: a chunk, but other fragments of the node "
                        "name children (a node is either inner or a leaf)"
                    )
                if (chunk.ref is not None and node.has_data) or (
                    chunk.data is not None and node.has_ref
                ):
                    raise _invalid(f"node {nid!r} seq {seq}: a leaf mixes inline data and refs")
            if seq == 0 and not chunk.has_metadata:
                raise _invalid(f"node {nid!r} seq 0: a leaf's seq 0 must carry chunk metadata")
            if node is not None and node.seq0_seen and not node.has_metadata:
                raise _invalid(
                    f"node {nid!r} seq {seq}: a chunk, but seq 0 of the node carried no chunk "
                    "metadata (a leaf's seq 0 must)"
                )
        elif node is not None and node.is_leaf:
            if fragment.child_ids:
                raise _invalid(
                    f"node {nid!r} seq {seq}: child_ids, but other fragments of the node "
                    "carry a chunk (a node is either inner or a leaf)"
                )
            if seq == 0:
                raise _invalid(
                    f"node {nid!r} seq 0: no chunk metadata, but the node is a leaf "
                    "(a leaf's seq 0 must carry it)"
                )

    def check_id(self, value: str, what: str) -> int:
        """``value``'s UTF-8 bytes; RESOURCE_EXHAUSTED naming ``what`` past ``max_id_bytes``
        (checked before any message quotes the value)."""
        limit = self.limits.max_id_bytes
        size = len(value) if len(value) > limit else len(value.encode())
        if size > limit:
            raise _exhausted(
                f"{what} {shown(value)} is longer than max_id_bytes ({limit}): {size} bytes"
            )
        return size

    def charge(self, size: int, what: str) -> None:
        """Count ``size`` more bytes the session holds for the client (an action's ids and
        configs); RESOURCE_EXHAUSTED naming ``what`` past ``max_bytes``."""
        limit = self.limits.max_bytes
        if self._bytes + size > limit:
            raise _exhausted(f"{what}: more bytes than max_bytes ({limit})")
        self._bytes += size

    def _check_strings(self, fragment: Fragment) -> None:
        self.check_id(fragment.id, "a node id")
        for child in fragment.child_ids:
            self.check_id(child, f"node {fragment.id!r} seq {fragment.seq}: a child id")
        chunk = fragment.chunk
        if chunk is not None:
            where = f"node {fragment.id!r} seq {fragment.seq}:"
            self.check_id(chunk.mimetype or "", f"{where} the mimetype")
            self.check_id(chunk.role or "", f"{where} the role")

    @staticmethod
    def _cost(node: _Node | None, fragment: Fragment) -> int:
        """The bytes a fragment adds to what the session holds (ids already checked short)."""
        size = 0 if node is not None else len(fragment.id.encode())
        size += sum(len(child.encode()) for child in fragment.child_ids)
        chunk = fragment.chunk
        if chunk is not None:
            size += len((chunk.mimetype or "").encode()) + len((chunk.role or "").encode())
            if chunk.data is not None:
                size += len(chunk.data)
            if chunk.ref is not None:
                size += len(chunk.ref.encode())
        return size

    def _check_limits(self, node: _Node | None, fragment: Fragment, cost: int) -> None:
        limits = self.limits
        if node is None and len(self._nodes) + 1 > limits.max_nodes:
            raise _exhausted(
                f"node {fragment.id!r} seq {fragment.seq}: more nodes than "
                f"max_nodes ({limits.max_nodes})"
            )
        if self._child_ids + len(fragment.child_ids) > limits.max_child_ids:
            raise _exhausted(
                f"node {fragment.id!r} seq {fragment.seq}: more child ids than "
                f"max_child_ids ({limits.max_child_ids})"
            )
        if self._bytes + cost > limits.max_bytes:
            raise _exhausted(
                f"node {fragment.id!r} seq {fragment.seq}: more bytes (payloads and ids) than "
                f"max_bytes ({limits.max_bytes})"
            )

    def _new_node(self, node_id: str, origin: str) -> _Node:
        node = _Node(origin)
        self._nodes[node_id] = node
        self._unreceived.discard(node_id)
        self._incomplete += 1
        return node

    @staticmethod
    def _apply(node: _Node, fragment: Fragment) -> None:
        node.children.extend(fragment.child_ids)
        chunk = fragment.chunk
        if chunk is not None:
            if chunk.data:
                node.parts.append(chunk.data)
            if chunk.ref is not None:
                node.refs.append(chunk.ref)

    def _finish(self, node_id: str, node: _Node) -> None:
        """The node has all its fragments: assemble it and count its blocking children."""
        node.self_complete = True
        self._incomplete -= 1
        if node.is_leaf:
            node.leaf = Leaf(
                node_id=node_id,
                mimetype=node.mimetype or DEFAULT_MIMETYPE,
                role=node.role,
                data=b"".join(node.parts),
                ref=node.refs[0] if node.refs else None,
                refs=tuple(node.refs),
            )
            node.parts = []
        nodes = self._nodes
        blockers = 0
        for child in node.children:
            other = nodes.get(child)
            if other is None or not other.deep_complete:
                blockers += 1
        node.blockers = blockers
        if blockers == 0:
            self._complete_deep(node_id)
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def _complete_deep(self, node_id: str) -> None:
        """The node and its descendants are complete: so may its parents now be."""
        nodes = self._nodes
        work = [node_id]
        while work:
            nid = work.pop()
            nodes[nid].deep_complete = True
            for parent_id in self._parents.get(nid, ()):
                parent = nodes[parent_id]
                if parent.self_complete and not parent.deep_complete:
                    parent.blockers -= 1
                    if parent.blockers == 0:
                        work.append(parent_id)

    # -- action outputs ----------------------------------------------------------------

    def claim_output(self, node_id: str) -> None:
        """Reserve an action's output id: it must be new (no node, no other output)."""
        if not node_id:
            raise _invalid("an action's output id is empty")
        size = self.check_id(node_id, "an action's output id")
        if node_id in self._nodes:
            raise _invalid(f"output id already used: {node_id!r}")
        if len(self._nodes) + 1 > self.limits.max_nodes:
            raise _exhausted(
                f"output {node_id!r}: more nodes than max_nodes ({self.limits.max_nodes})"
            )
        self.charge(size, f"output {node_id!r}")
        self._new_node(node_id, _CLAIMED)

    def add_output(self, node_id: str, mimetype: str, role: str, data: bytes) -> None:
        """Store a leaf the server produced (complete at once), claimed or not, so that later
        actions and client nodes can name it. An empty mimetype reads as DEFAULT_MIMETYPE."""
        if not node_id:
            raise _invalid("an action's output id is empty")
        size = self.check_id(node_id, "an action's output id")
        node = self._nodes.get(node_id)
        if node is not None and node.origin != _CLAIMED:
            raise _invalid(f"output id already used: {node_id!r}")
        limits = self.limits
        if node is None and len(self._nodes) + 1 > limits.max_nodes:
            raise _exhausted(f"output {node_id!r}: more nodes than max_nodes ({limits.max_nodes})")
        if node is not None:
            size = 0  # counted when claimed
        size += len(data)
        if self._bytes + size > limits.max_bytes:
            raise _exhausted(
                f"output {node_id!r}: more payload bytes than max_bytes ({limits.max_bytes})"
            )
        if node is None:
            node = self._new_node(node_id, _OUTPUT)
        node.origin = _OUTPUT
        node.is_leaf = node.has_metadata = node.seq0_seen = True
        node.has_data = bool(data)
        node.mimetype, node.role = mimetype, role
        node.parts = [bytes(data)] if data else []
        node.final_seq, node.max_seq, node.next_seq = 0, 0, 1
        self._bytes += size
        self._finish(node_id, node)

    # -- completion --------------------------------------------------------------------

    def is_complete(self, node_id: str) -> bool:
        """Whether the node and every descendant have arrived to their final fragment."""
        node = self._nodes.get(node_id)
        return node is not None and node.deep_complete

    def missing(self, node_id: str) -> list[str]:
        """Ids under ``node_id`` (itself included) not received to their final fragment yet
        (not arrived at all, arriving, or a claimed output not produced), sorted. Empty when
        the node is complete, or when only a cycle keeps it from completing."""
        found: list[str] = []
        seen = {node_id}
        todo = [node_id]
        nodes = self._nodes
        while todo:
            nid = todo.pop()
            node = nodes.get(nid)
            if node is None:
                found.append(nid)
                continue
            if node.deep_complete:
                continue
            if not node.self_complete:
                found.append(nid)
            for child in self._known_children(node):
                if child not in seen:
                    seen.add(child)
                    todo.append(child)
        return sorted(found)

    @staticmethod
    def _known_children(node: _Node) -> Iterator[str]:
        yield from node.children
        for fragment in node.pending.values():
            yield from fragment.child_ids

    async def wait_complete(self, node_ids: Sequence[str], timeout_s: float) -> None:
        """Return once every node in ``node_ids`` is complete (see :meth:`is_complete`).

        Raises DEADLINE_EXCEEDED naming the missing ids after ``timeout_s``, or
        INVALID_ARGUMENT naming the cycle when every node is here but a cycle keeps one of
        them from completing (checked as soon as nothing in the session is missing, else at
        the deadline)."""
        waiting = [n for n in dict.fromkeys(node_ids) if not self.is_complete(n)]
        if not waiting:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while waiting:
            if self._incomplete == 0 and not self._unreceived:
                self._raise_cycle(waiting)
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            if self._changed is None:
                self._changed = asyncio.Event()
            changed = self._changed
            try:
                async with asyncio.timeout(remaining):
                    await changed.wait()
            except TimeoutError:
                break
            waiting = [n for n in waiting if not self.is_complete(n)]
        if not waiting:
            return
        missing = sorted({m for n in waiting for m in self.missing(n)})
        if not missing:
            self._raise_cycle(waiting)
        raise SessionAbort(
            "DEADLINE_EXCEEDED",
            f"nodes not complete after {timeout_s:g} s: waiting for {_names(waiting)}; "
            f"missing {_names(missing)}",
        )

    def _raise_cycle(self, roots: Sequence[str]) -> None:
        for root in roots:
            cycle = self._find_cycle(root)
            if cycle is not None:
                raise _invalid(f"node {root!r} contains a cycle: {' -> '.join(cycle)}")

    def _find_cycle(self, root: str) -> list[str] | None:
        """A cycle reachable from ``root`` (its ids, the first repeated last), if any."""
        nodes = self._nodes
        if root not in nodes:
            return None
        done: set[str] = set()
        path: list[str] = [root]
        on_path = {root}
        stack: list[Iterator[str]] = [self._known_children(nodes[root])]
        while stack:
            child = next(stack[-1], None)
            if child is None:
                stack.pop()
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
                continue
            if child in on_path:
                return [*path[path.index(child) :], child]
            node = nodes.get(child)
            if child in done or node is None or node.deep_complete:
                continue
            path.append(child)
            on_path.add(child)
            stack.append(self._known_children(node))
        return None

    # -- leaves out --------------------------------------------------------------------

    def leaves(self, node_id: str) -> list[Leaf]:
        """The leaves under ``node_id`` depth-first, children in order (a node shared by
        several parents yields its leaves each time). Raises INVALID_ARGUMENT on a cycle,
        RESOURCE_EXHAUSTED past ``max_depth`` (or past ``max_nodes`` visits or ``max_bytes``
        of data in all), and FAILED_PRECONDITION when a node under it is not received yet."""
        limits = self.limits
        nodes = self._nodes
        out: list[Leaf] = []
        total = 0
        visits = 0
        path: list[str] = []
        on_path: set[str] = set()
        stack: list[Iterator[str]] = []

        def enter(nid: str) -> None:
            nonlocal total, visits
            if len(path) > limits.max_depth:
                raise _exhausted(
                    f"node {nid!r} is nested deeper than max_depth ({limits.max_depth}) "
                    f"under {node_id!r}"
                )
            visits += 1
            if visits > limits.max_nodes:
                raise _exhausted(
                    f"flattening {node_id!r} visits more nodes than max_nodes ({limits.max_nodes})"
                )
            node = nodes.get(nid)
            if node is None or not node.self_complete:
                raise SessionAbort("FAILED_PRECONDITION", f"node {nid!r} is not complete")
            if node.leaf is not None:
                total += len(node.leaf.data)
                if total > limits.max_bytes:
                    raise _exhausted(
                        f"flattening {node_id!r} yields more bytes than "
                        f"max_bytes ({limits.max_bytes})"
                    )
                out.append(node.leaf)
                return
            path.append(nid)
            on_path.add(nid)
            stack.append(iter(node.children))

        enter(node_id)
        while stack:
            child = next(stack[-1], None)
            if child is None:
                stack.pop()
                on_path.discard(path.pop())
                continue
            if child in on_path:
                cycle = [*path[path.index(child) :], child]
                raise _invalid(f"node {node_id!r} contains a cycle: {' -> '.join(cycle)}")
            enter(child)
        return out
