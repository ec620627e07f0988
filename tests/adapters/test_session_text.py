"""A prompt whose text extends the text a session holds keeps the session's tokens: the rule
(``tokens_for_prompt``), its edges, and the adapters on it against the reference runtimes."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from test_harness.kakeya_runtime import RunningRuntime, serve_kakeya
from test_harness.salience_runtime import serve_salience
from worker_adapters import GenerationRequest, Token
from worker_adapters.kakeya import KakeyaAdapter
from worker_adapters.salience import SalienceAdapter
from worker_adapters.session_handle import EngineSession
from worker_adapters.sessions import SessionFinish, continuation, tokens_for_prompt
from worker_adapters.sim import VOCAB
from worker_adapters.tokenizers import SimTokenizer

SIM = SimTokenizer()
PROMPT = "User: plan step\nAssistant:"  # a transcript: the reply follows the label directly


def record(*parts: list[int]) -> EngineSession:
    """A session whose record is ``parts`` joined, as a fresh engine session got it."""
    session = EngineSession(protocol="kakeya", replica="r")
    session.rebuilt("s1", "r", [t for part in parts for t in part])
    return session


def words(*names: str) -> list[int]:
    """The sim vocabulary's ids of ``names`` (each a word with its trailing space)."""
    return [VOCAB.index(f"{name} ") for name in names]


def test_a_prompt_whose_tokens_extend_the_record_is_its_own_tokenization() -> None:
    session = record(SIM.encode("plan step "))
    tokens = SIM.encode("plan step tool ")
    assert tokens_for_prompt(session, "plan step tool ", tokens, SIM) == tokens


def test_a_prompt_whose_text_extends_the_record_keeps_the_record_s_tokens() -> None:
    reply = words("tool", "call")  # generated: the label's last byte, then a word
    session = record(SIM.encode(PROMPT), reply)
    text = PROMPT + "tool call " + "\nUser: fact\nAssistant:"
    whole = SIM.encode(text)
    # tokenized whole, the label and the reply merge ("Assistant:tool ", "call \n" are bytes)
    assert whole[: len(session.history)] != session.history
    got = tokens_for_prompt(session, text, whole, SIM)
    rest = continuation(SIM, "\nUser: fact\nAssistant:")
    assert rest is not None and got == session.history + rest
    assert b"".join(map(SIM.piece, got)) == text.encode()  # it spells the prompt


def test_the_boundary_is_where_the_record_ends_even_inside_a_word() -> None:
    """A suffix that a whole tokenization would join to the record's last token is tokenized
    on its own: the record's tokens are never split again."""
    session = record(SIM.encode("plan "), SIM.encode("st"))  # the record ends mid-word
    text = "plan step tool "
    got = tokens_for_prompt(session, text, SIM.encode(text), SIM)
    assert got == session.history + SIM.encode("ep ") + words("tool")
    assert SIM.encode(text) == words("plan", "step", "tool")  # not what a one-shot holds


def test_a_prompt_that_rewrites_the_record_is_its_own_tokenization() -> None:
    session = record(SIM.encode(PROMPT), words("tool", "call"))
    text = PROMPT + "tool flow \nUser: fact\nAssistant:"
    assert tokens_for_prompt(session, text, SIM.encode(text), SIM) == SIM.encode(text)


def test_a_prompt_equal_to_the_record_s_text_adds_nothing() -> None:
    session = record(SIM.encode(PROMPT), words("tool"))
    text = PROMPT + "tool "
    assert tokens_for_prompt(session, text, SIM.encode(text), SIM) == session.history


def test_a_record_ending_inside_a_character_is_not_a_boundary() -> None:
    """The record's last token holds part of a character (the client never saw it): a prompt
    that completes the character does not extend the record at a token boundary."""
    partial = list(SIM.encode("日")[:2])  # two of the character's three bytes
    session = record([len(VOCAB) + b for b in b"plan "], partial)  # "plan " as bytes
    text = "plan 日本"
    assert session.spelled(SIM.piece) == text.encode()[:7]  # the bytes do match
    assert tokens_for_prompt(session, text, SIM.encode(text), SIM) == SIM.encode(text)


class SpacePrefixing(SimTokenizer):
    """A vocabulary that puts a space before the first word of any text, as some do."""

    def encode(self, text: str) -> list[int]:
        return super().encode(" " + text if text else text)


def test_a_suffix_its_tokens_cannot_spell_is_not_appended() -> None:
    tokenizer = SpacePrefixing()
    assert continuation(tokenizer, "fact ") is None
    session = record(tokenizer.encode("plan "), words("tool"))
    text = "plan tool fact "
    whole = tokenizer.encode(text)
    assert tokens_for_prompt(session, text, whole, tokenizer) == whole


def test_the_held_text_follows_rewinds_and_read_backs() -> None:
    session = record(SIM.encode("plan step tool "))
    assert session.spelled(SIM.piece) == b"plan step tool "
    session.rewound(1)
    assert session.spelled(SIM.piece) == b"plan "
    session.appended(words("flow"))
    assert session.spelled(SIM.piece) == b"plan flow "
    session.read_back(words("tool", "call"))
    assert session.spelled(SIM.piece) == b"tool call "


llama = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason="llama_cpp is not installed"
)


@llama
def test_a_gguf_vocabulary_continues_without_its_bos_and_keeps_split_words() -> None:
    from worker_adapters.tokenizers import tokenizer_named

    gguf = tokenizer_named("gguf")
    bos = gguf.encode("")
    rest = continuation(gguf, "ian food")
    assert rest is not None and rest == gguf.encode("ian food")[len(bos) :]
    generated = gguf.encode(" Par")[len(bos) :]  # the reply as the engine made it
    session = record(gguf.encode("The city of"), generated)
    text = "The city of Parisian food"
    got = tokens_for_prompt(session, text, gguf.encode(text), gguf)
    assert got == session.history + cast(list[int], continuation(gguf, "isian food"))
    assert b"".join(map(gguf.piece, got)) == text.encode()


# The adapters, against the reference runtimes


def req(prompt: str, rid: str, **kw: Any) -> GenerationRequest:
    fields: dict[str, Any] = {"request_id": rid, "prompt": prompt, "messages": None}
    fields.update({"seed": 7, "max_tokens": 5, **kw})
    return GenerationRequest(**fields)


async def run(
    adapter: KakeyaAdapter | SalienceAdapter, request: GenerationRequest
) -> tuple[str, SessionFinish]:
    events = [e async for e in adapter.stream(request)]
    *tokens, finish = events
    assert isinstance(finish, SessionFinish), events[-1:]
    return "".join(cast(Token, t).text for t in tokens), finish


@pytest.fixture
async def kakeya() -> AsyncIterator[tuple[RunningRuntime, KakeyaAdapter]]:
    async with serve_kakeya() as rt:
        adapter = KakeyaAdapter(target=rt.address, tokenizer=SIM, model="sim-1", context_size=4096)
        yield rt, adapter
        await adapter.aclose()


def held(rt: RunningRuntime, session: EngineSession) -> list[int]:
    return rt.store.sessions[cast(str, session.session_id)].tokens


def question(text: str) -> str:
    return f"\nUser: {text}\nAssistant:"


async def test_re_sent_turns_append_only_the_new_text_on_one_kakeya_session(
    kakeya: tuple[RunningRuntime, KakeyaAdapter],
) -> None:
    rt, adapter = kakeya
    session = adapter.open_session()
    prompt, expected = PROMPT, len(SIM.encode(PROMPT))
    for turn in range(4):
        before = list(session.history)
        reply, finish = await run(adapter, req(prompt, f"r{turn}", session=session))
        engine = rt.store.sessions[cast(str, session.session_id)]
        assert engine.received == expected  # the first prompt, then each turn's new text
        if turn:
            added = cast(list[int], continuation(SIM, question(f"fact {turn} ")))
            assert session.history[len(before) :][: len(added)] == added
            assert finish.tokens_in == len(before) + len(added)
        prompt += reply + question(f"fact {turn + 1} ")
        expected += len(cast(list[int], continuation(SIM, question(f"fact {turn + 1} "))))
        assert SIM.encode(prompt)[: len(session.history)] != session.history  # ids diverged
    assert rt.store.created == 1 and session.rebuilds == 0
    assert held(rt, session) == session.history


async def test_a_reply_cut_at_a_stop_string_extends_only_through_the_stop(
    kakeya: tuple[RunningRuntime, KakeyaAdapter],
) -> None:
    """The engine holds the tokens through the stop string, which the client never saw: a
    prompt re-sending the visible reply rewrites that (a new session holding the prompt); one
    that goes on with the stop's text extends it."""
    rt, adapter = kakeya
    plain, _ = await run(adapter, req(PROMPT, "r0", max_tokens=5))
    stop = plain.split()[2]  # the third word, its trailing space left to the record
    visible = plain[: plain.index(stop)]
    for resent, kept in ((visible, False), (visible + stop + " ", True)):
        session = adapter.open_session()
        reply, finish = await run(adapter, req(PROMPT, "r1", session=session, stop=(stop,)))
        assert (reply, finish.stop_reason) == (visible, "stop")
        record_ = list(session.history)
        assert session.spelled(SIM.piece) == (PROMPT + visible + stop + " ").encode()
        prompt = PROMPT + resent + question("fact ")
        await run(adapter, req(prompt, "r2", session=session))
        whole = SIM.encode(prompt)
        if kept:  # the record, then the question on its own
            added = cast(list[int], continuation(SIM, question("fact ")))
            assert session.history[: len(record_) + len(added)] == record_ + added
        else:
            assert session.history[: len(whole)] == whole and session.rebuilds == 1
        assert held(rt, session) == session.history  # whatever the runtime ran ahead


async def test_after_a_cancel_the_record_is_what_the_next_prompt_extends(
    kakeya: tuple[RunningRuntime, KakeyaAdapter],
) -> None:
    rt, adapter = kakeya
    session = adapter.open_session()
    release = rt.faults.hold(after_tokens=2)
    stream = adapter.stream(req(PROMPT, "r1", session=session, max_tokens=50))
    seen = "".join([cast(Token, await anext(stream)).text for _ in range(2)])
    await adapter.cancel("r1")
    assert [e async for e in stream] == []
    release.set()
    engine = rt.store.sessions[cast(str, session.session_id)]
    while engine.busy:  # the runtime notices the cancelled call
        await asyncio.sleep(0.01)
    assert session.verify and session.spelled(SIM.piece) == (PROMPT + seen).encode()
    record_ = list(session.history)
    # what the client saw, then a question: the record kept (the runtime's extra tokens are
    # not: it is rebuilt from the record if it holds more)
    await run(adapter, req(PROMPT + seen + question("fact "), "r2", session=session))
    added = cast(list[int], continuation(SIM, question("fact ")))
    assert session.history[: len(record_) + len(added)] == record_ + added
    assert held(rt, session) == session.history
    # the cancelled step asked again: the prompt rewrote the record, a new session holds it
    rebuilds = session.rebuilds
    await run(adapter, req(PROMPT, "r3", session=session))
    assert session.history[: len(SIM.encode(PROMPT))] == SIM.encode(PROMPT)
    assert session.rebuilds == rebuilds + 1 and held(rt, session) == session.history


async def test_a_fork_starts_from_its_own_prompt_not_its_parent_s_record() -> None:
    """A forked run's first prompt has no record of its own to extend: it is tokenized whole,
    so its tokens never depend on how far its parent got; Salience still copies the prefix
    the two share on the server."""
    async with serve_salience() as rt:
        adapter = SalienceAdapter(target=rt.address, tokenizer=SIM, model="sim-1")
        parent = adapter.open_session()
        reply, _ = await run(adapter, req(PROMPT, "r1", session=parent))
        prompt = PROMPT + reply + question("fact ")
        await run(adapter, req(prompt, "r2", session=parent))
        child = adapter.open_session()
        child.fork_of = parent
        forked, _ = await run(adapter, req(prompt, "r3", session=child))
        whole = SIM.encode(prompt)
        assert child.history[: len(whole)] == whole
        assert child.forked_at is not None and 0 < child.forked_at < len(whole)
        alone, _ = await run(adapter, req(prompt, "r4"))  # a one-shot of the same prompt
        assert forked == alone
        await adapter.aclose()
