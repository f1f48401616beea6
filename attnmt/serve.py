"""``attnmt serve RUN``: an HTTP API and a web page that shows what the model attends to.

* ``POST /translate`` ``{"text": ...}`` or ``{"texts": [...]}`` with optional ``beam``,
  ``n_best``, ``alpha``, ``sample``, ``attention``, ``self_attention`` and ``target_lang``;
* ``GET /health``, ``GET /info`` (what a client needs: languages, size, what the model
  can show), ``GET /openapi.json``;
* ``GET /``: the attention viewer (one HTML page, no outside assets);
* LibreTranslate's API on the same paths (``POST /translate`` with ``q``, ``source``,
  ``target``, ...; ``GET /languages``; ``POST /detect``): see :mod:`attnmt.libretranslate`.

Requests are micro-batched: a queue collects the texts of concurrent requests for a
few milliseconds and decodes them together in one worker thread, off the event loop,
so ``/health`` answers while the model works; if a batch fails, each of its requests is
decoded again alone, so only the one at fault gets the error. Every request is checked
before any work: its body size (413, before it is parsed), every value against its
bounds (422 naming the field), its cost (:func:`request_cost`: the decoding work, output
length limit x beam, 413 above ``max_work``; the numbers its response may carry, 413
above ``max_response_values``) and the cost already waiting (503 with ``Retry-After``
above ``max_queue_work`` or ``max_queue_response_values``), so one client can neither
hold the only worker for long, nor make the server build a response it cannot hold,
nor starve the others. Clients share the worker fairly (:class:`MicroBatcher`): each is
charged the seconds its requests took, decoding and rendering their responses, and the
least charged waiting client goes next.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import json
import logging
import math
import re
from dataclasses import dataclass
from typing import Callable
from importlib import resources

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from attnmt import documents, libretranslate as libre
from attnmt.errors import UserError
from attnmt.decoding import MIN_TEMPERATURE, Sampling
from attnmt.translator import Translation, Translator

logger = logging.getLogger("attnmt.serve")


@dataclass(frozen=True)
class Limits:
    max_chars: int = 1000          # per text
    max_texts: int = 32            # per request
    max_beam: int = 10
    max_n_best: int = 10
    max_body_bytes: int = 1 << 20  # refused before parsing
    max_work: int = 8000           # per request: output length limit x beam (or samples), summed
    max_queue_work: int = 32000    # work accepted and not yet answered, over all requests
    max_response_values: int = 500_000          # per request: numbers and tokens it may return
    max_queue_response_values: int = 2_000_000  # the same, accepted and not yet answered
    max_html_tags: int = 10_000    # '<' per HTML document, counted before it is parsed
    body_timeout: float = 10.0     # seconds a request body may take to arrive
    max_connections: int = 1000    # requests in progress (bodies arriving, or answered)
    max_inflight_body_bytes: int = 64 << 20     # declared sizes of the bodies arriving
    refusal_delay: float = 0.0     # an address refused again within it waits that long (serve: 1)


class SampleRequest(BaseModel):
    """Sampling instead of beam search: ``n_best`` samples per text."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    temperature: float = Field(1.0, le=100)
    top_k: int = Field(0, ge=0, le=1_000_000)
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int = Field(0, ge=0, lt=2 ** 63)

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, value):
        if not value >= MIN_TEMPERATURE:
            raise ValueError(f"must be at least {MIN_TEMPERATURE:g}: below it every score "
                             "overflows")
        return value


class TranslateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    text: str | None = None
    texts: list[str] | None = None
    beam: int | None = Field(None, ge=1)
    n_best: int = Field(1, ge=1)
    alpha: float | None = Field(None, ge=0, le=10)
    sample: SampleRequest | None = None
    attention: bool = False
    self_attention: bool = False
    target_lang: str | None = Field(None, max_length=16)
    model: str | None = Field(None, max_length=200)
    prefix: str | None = Field(None, max_length=1000)
    trace: bool = False
    api_key: str | None = Field(None, max_length=200)   # when the server has --api-keys

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value):
        return None if value is None else libre.valid_unicode(value)

    @field_validator("text")
    @classmethod
    def _text(cls, value):
        return None if value is None else libre.valid_unicode(value)

    @field_validator("texts")
    @classmethod
    def _texts(cls, value):
        return None if value is None else [libre.valid_unicode(text) for text in value]


class LimitError(Exception):
    def __init__(self, status: int, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after

    def response(self) -> JSONResponse:
        headers = {} if self.retry_after is None else {"Retry-After": str(self.retry_after)}
        return JSONResponse({"error": self.message}, status_code=self.status, headers=headers)


def check_request(request: TranslateRequest, limits: Limits, default_beam: int) -> list[str]:
    """The texts of a request, or a :class:`LimitError` naming the limit it breaks."""
    if (request.text is None) == (request.texts is None):
        raise LimitError(422, "give exactly one of 'text' or 'texts'")
    texts = [request.text] if request.text is not None else request.texts
    if len(texts) > limits.max_texts:
        raise LimitError(413, f"too many texts: {len(texts)} > max_texts {limits.max_texts}")
    for number, text in enumerate(texts, start=1):
        if len(text) > limits.max_chars:
            raise LimitError(413, f"text {number} has {len(text)} characters > max_chars "
                                  f"{limits.max_chars}")
    beam = default_beam if request.beam is None else request.beam
    if not 1 <= beam <= limits.max_beam:
        raise LimitError(422, f"beam must be between 1 and max_beam {limits.max_beam}, got {beam}")
    if request.sample is not None:
        if not 1 <= request.n_best <= limits.max_n_best:
            raise LimitError(422, f"n_best (samples) must be between 1 and max_n_best "
                                  f"{limits.max_n_best}, got {request.n_best}")
    elif not 1 <= request.n_best <= min(beam, limits.max_n_best):
        raise LimitError(422, f"n_best must be between 1 and min(beam, max_n_best "
                              f"{limits.max_n_best}) = {min(beam, limits.max_n_best)}, "
                              f"got {request.n_best}")
    return texts


@dataclass(frozen=True)
class Cost:
    """What a request costs before it is decoded: ``work``, the output tokens the search may
    write times the beam (or samples), and ``values``, the most numbers and tokens its
    response may carry, by part (hypotheses, attention, self-attention, search steps)."""
    work: int
    parts: dict

    @property
    def values(self) -> int:
        return sum(self.parts.values())


def request_cost(translator: Translator, texts: list[str], options: "Options") -> Cost:
    """The :class:`Cost` of translating ``texts`` with ``options``, bounded by each text's
    output length limit (the search may run to it: a large ``alpha``, a prefix, a model
    that does not stop), not by the output it will probably write. A text longer than
    the model accepts (its tags counted) is a 413 naming it."""
    sources = translator.source_ids(texts, options.target_lang)
    try:
        translator.check_lengths(sources)
    except UserError as error:
        raise LimitError(413, str(error).replace("input", "text", 1)) from None
    search = translator.search_options()
    width = options.n_best if options.sampling else options.beam
    layers, heads = translator.engine.attention_grid or (0, 0)
    model = translator.config.model
    work, parts = 0, dict.fromkeys(("hypotheses", "attention", "self_attention", "search_steps"), 0)
    for ids in sources:
        read, limit = len(ids) + 1, search.output_limit(len(ids))        # EOS read, EOS written
        if not ids:           # source, translation, one empty hypothesis (text, score, attention)
            parts["hypotheses"] += 4 + options.attention
            continue
        work += width * limit
        parts["hypotheses"] += read + 1 + options.n_best * (limit + 1)   # and text, score each
        if options.attention:
            parts["attention"] += options.n_best * limit * layers * heads * read
        if options.self_attention:
            parts["self_attention"] += model.heads * (model.encoder_layers * read ** 2 +
                                                      model.decoder_layers * limit ** 2)
        if options.trace:      # a step: its number, up to 2 x beam candidates with tokens, score
            parts["search_steps"] += limit * (1 + options.beam * (limit + 3))
    return Cost(work, parts)


def check_cost(cost: Cost, limits: Limits) -> None:
    """413 naming what to reduce when a request costs more than one request may."""
    if cost.work > limits.max_work:
        raise LimitError(413, f"the request needs up to {cost.work} token-beams of work (output "
                              f"length limit x beam) > max_work {limits.max_work}; send fewer or "
                              "shorter texts or a smaller beam")
    if cost.values > limits.max_response_values:
        largest = max(cost.parts, key=cost.parts.get)
        remedy = {"hypotheses": "ask for a smaller n_best or send fewer or shorter texts",
                  "attention": "leave out attention, ask for a smaller n_best or send shorter texts",
                  "self_attention": "leave out self_attention or send shorter texts",
                  "search_steps": "leave out trace, or use a smaller beam or shorter texts",
                  "documents": "send less text or ask for fewer alternatives"}[largest]
        described = ", ".join(f"{part} {count}" for part, count in cost.parts.items() if count)
        raise LimitError(413, f"the response could carry {cost.values} values ({described}) > "
                              f"max_response_values {limits.max_response_values}; {remedy}")


@dataclass(frozen=True)
class Options:
    """Decoding options; requests with equal options share a batch."""
    beam: int
    n_best: int
    alpha: float | None
    attention: bool
    sampling: Sampling | None = None
    target_lang: str | None = None
    prefix: str | None = None
    trace: bool = False
    self_attention: bool = False


@dataclass
class _Pending:
    texts: list[str]
    options: Options
    future: asyncio.Future
    client: str
    finish: Callable[[list[Translation]], object] | None = None   # run after decoding
    work: int = 0                  # its decoding work (:class:`Cost`), to estimate its seconds


class MicroBatcher:
    """Collects concurrent requests for ``wait_ms`` and translates them in batches;
    ``workers`` batches are decoded at once (each in a thread of ``executor``).

    Clients (an API key, else an address) share the workers fairly: each is charged the
    seconds its requests took (a batch's decoding split by texts, and its own rendering),
    and the next batch starts with the oldest request of the waiting client that will have
    been charged least once it has run (its seconds estimated from its work, at the running
    seconds per unit of work), joined by the others' requests with the same options. A
    client that sends heavy requests pays for them and waits while the others catch up, and
    the worker waits a moment for a client between two requests that is owed more; one that
    arrives or returns is charged at least what the least charged waiting client is, so
    idling earns nothing."""

    def __init__(self, translator: Translator, executor: concurrent.futures.Executor,
                 wait_ms: float, max_texts: int, workers: int = 1):
        self.translator, self.executor = translator, executor
        self.wait, self.max_texts, self.count = wait_ms / 1000, max_texts, workers
        self.waiting: dict[str, collections.deque[_Pending]] = {}
        self.charged: collections.OrderedDict[str, float] = collections.OrderedDict()
        self.least_charged = 0.0                     # of the clients waiting at the last batch
        self.in_flight: set[str] = set()             # clients whose batch is being decoded
        self.answered: dict[str, float] = {}         # client: when its last batch ended
        self.seconds_per_work = 0.0                  # of the batches decoded, a running mean
        self.arrived: asyncio.Event | None = None
        self.workers: list[asyncio.Task] = []

    async def translate(self, texts: list[str], options: Options, client: str = "",
                        finish: Callable[[list[Translation]], object] | None = None,
                        work: int = 0):
        """The translations of ``texts``, or what ``finish`` makes of them: it runs in the
        worker after the batch (a response rendered, self-attention computed), its time
        charged to ``client`` alone. ``work``: the request's :class:`Cost` work, from which
        its seconds are estimated before it runs."""
        if self.arrived is None:
            self.arrived = asyncio.Event()
            self.workers = [asyncio.create_task(self._work()) for _ in range(self.count)]
        future = asyncio.get_running_loop().create_future()
        if client not in self.waiting:
            self.waiting[client] = collections.deque()
            self.charged[client] = max(self.charged.pop(client, 0.0), self.least_charged)
            while len(self.charged) > MOST_CLIENTS_REMEMBERED:
                self.charged.popitem(last=False)
        self.waiting[client].append(_Pending(texts, options, future, client, finish, work))
        self.arrived.set()
        return await future

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self.waiting:
                self.arrived.clear()
                await self.arrived.wait()
            deadline = loop.time() + self.wait
            while self._waiting_texts() < self.max_texts and loop.time() < deadline:
                self.arrived.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.arrived.wait(), deadline - loop.time())
            if self._owed_elsewhere(loop.time()):       # hold the worker for a client
                self.arrived.clear()                   # between two of its requests
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.arrived.wait(), BETWEEN_REQUESTS)
                continue
            batch = self._take_batch()
            if batch:
                clients = {p.client for p in batch}
                self.in_flight.update(clients)
                try:
                    await self._run(batch, batch[0].options)
                finally:
                    self.in_flight.difference_update(clients)
                    now = loop.time()
                    self.answered.update((client, now) for client in clients)

    def _owed_elsewhere(self, now: float) -> bool:
        """Whether a client charged less than every waiting one is between two requests
        (its request being decoded by another worker, or answered within
        :data:`BETWEEN_REQUESTS`): the worker then waits for it rather than start a
        request of a client that has had more than its share."""
        least = min(map(self._due, self.waiting))
        for client, answered in list(self.answered.items()):
            if now - answered > BETWEEN_REQUESTS:
                del self.answered[client]
            elif client not in self.waiting and self.charged.get(client, least) < least:
                return True
        return any(self.charged.get(client, least) < least for client in self.in_flight
                   if client not in self.waiting)

    def _waiting_texts(self) -> int:
        return sum(len(p.texts) for queue in self.waiting.values() for p in queue)

    def _take_batch(self) -> list[_Pending]:
        """The next batch: the oldest request of the least charged client, and the requests
        of every client with the same options, least charged first, up to ``max_texts``."""
        if not self.waiting:
            return []
        clients = sorted(self.waiting, key=self._due)
        self.least_charged = self.charged.get(clients[0], 0.0)
        options = self.waiting[clients[0]][0].options
        batch, texts = [], 0
        for client in clients:
            queue = self.waiting[client]
            while queue and queue[0].options == options and (
                    not batch or texts + len(queue[0].texts) <= self.max_texts):
                batch.append(queue.popleft())
                texts += len(batch[-1].texts)
            if not queue:
                del self.waiting[client]
        return batch

    def _due(self, client: str) -> float:
        """What ``client`` will have been charged once its next request has run (its
        seconds estimated from its work): heavy requests go after the light ones that would
        end sooner."""
        return self.charged.get(client, 0.0) + \
            self.seconds_per_work * self.waiting[client][0].work

    def _charge(self, client: str, seconds: float) -> None:
        if client in self.charged:
            self.charged[client] += seconds

    async def _run(self, pending: list[_Pending], options: Options) -> None:
        """Decode the requests together; if that fails, each alone, so that only a request
        at fault gets an error, and one that speaks of its own texts only."""
        loop = asyncio.get_running_loop()
        texts = [text for p in pending for text in p.texts]
        started = loop.time()
        try:
            results = await run_translation(self.translator, self.executor, texts, options)
        except Exception as error:
            if len(pending) == 1:
                self._charge(pending[0].client, loop.time() - started)
                _settle(pending[0].future, error=error)
            else:
                for p in pending:
                    await self._run([p], options)
            return
        seconds, start = loop.time() - started, 0
        work = sum(p.work for p in pending)
        if work:
            self.seconds_per_work += 0.2 * (seconds / work - self.seconds_per_work)
        for p in pending:
            mine = results[start:start + len(p.texts)]
            start += len(p.texts)
            self._charge(p.client, seconds * max(len(p.texts), 1) / max(len(texts), 1))
            if p.finish is None:
                _settle(p.future, mine)
                continue
            started = loop.time()
            try:
                _settle(p.future, await loop.run_in_executor(self.executor, p.finish, mine))
            except Exception as error:
                _settle(p.future, error=error)
            self._charge(p.client, loop.time() - started)


MOST_CLIENTS_REMEMBERED = 10_000
BETWEEN_REQUESTS = 0.1     # seconds a client answered is expected back with its next request


def _settle(future: asyncio.Future, result=None, error: Exception | None = None) -> None:
    """Answer a waiting request (unless its client has gone)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


async def run_translation(translator: Translator, executor, texts: list[str], options: Options):
    return await asyncio.get_running_loop().run_in_executor(
        executor, lambda: translator.translate(texts, options.beam, options.n_best, options.alpha,
                                               need_attention=options.attention,
                                               sampling=options.sampling,
                                               target_lang=options.target_lang,
                                               prefix=options.prefix, trace=options.trace))


def nested_lists(weights: np.ndarray) -> list:
    """``(layers, heads, rows, columns)`` array -> nested lists rounded to 4 decimals."""
    return np.round(np.asarray(weights, dtype=np.float64), 4).tolist()


def attention_grid(weights: np.ndarray) -> list:
    """Cross-attention ``(T, layers, heads, S)`` as ``[layer][head][target][source]``."""
    return nested_lists(weights.transpose(1, 2, 0, 3))


def _number(value: float) -> float | None:
    """JSON has no NaN or infinity: such a score is sent as null."""
    return round(value, 4) if math.isfinite(value) else None


def describe(translation: Translation, attention: bool, self_attention=None) -> dict:
    result = {"source": translation.source, "source_tokens": translation.source_tokens,
              "translation": translation.best.text,
              "hypotheses": [{"text": h.text, "score": _number(h.score), "tokens": h.tokens}
                             for h in translation.hypotheses]}
    if translation.search_steps is not None:
        result["search_steps"] = [{key: value if key == "step" else
                                   [{"tokens": item["tokens"], "score": _number(item["score"])}
                                    for item in value] for key, value in step.items()}
                                  for step in translation.search_steps]
    if attention:
        for hypothesis, described in zip(translation.hypotheses, result["hypotheses"]):
            described["attention"] = None if hypothesis.attention is None else \
                attention_grid(hypothesis.attention)
    if self_attention is not None:
        result["encoder_self_attention"] = nested_lists(self_attention[0])
        result["decoder_self_attention"] = nested_lists(self_attention[1])
    return result


def render(name: str, translations: list[Translation], attention: bool, maps: list) -> bytes:
    """The JSON body of a translation response, as compact as FastAPI's own."""
    described = [describe(translation, attention, self_attention)
                 for translation, self_attention in zip(translations, maps)]
    return json.dumps({"model": name, "translations": described}, ensure_ascii=False,
                      allow_nan=False, separators=(",", ":")).encode("utf-8")


def read_translate_request(parsed: object, unreadable: Exception | None) -> TranslateRequest:
    """attnmt's own request from its parsed JSON body, or the error that parsing raised
    (422 naming the field at fault)."""
    if unreadable is not None:
        raise LimitError(422, f"invalid request: body: {unreadable}")
    try:
        return TranslateRequest.model_validate(parsed)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(('body',) + tuple(str(p) for p in e['loc']))}: "
                             f"{e['msg']}" for e in error.errors())
        raise LimitError(422, f"invalid request: {problems}") from None


def reserve(waiting: dict, cost: Cost, limits: Limits) -> None:
    """Count a request's cost as waiting, or 503 when the server already waits on enough."""
    for key, limit, name, unit in (("work", limits.max_queue_work, "max_queue_work",
                                    "token-beams of work"),
                                   ("values", limits.max_queue_response_values,
                                    "max_queue_response_values", "response values")):
        added = cost.work if key == "work" else cost.values
        if waiting[key] + added > limit:
            raise LimitError(503, f"busy: {waiting[key]} {unit} are waiting ({name} {limit}); "
                                  "retry shortly", retry_after=1)
    waiting["work"] += cost.work
    waiting["values"] += cost.values


@contextlib.contextmanager
def reserved(waiting: dict, cost: Cost, limits: Limits):
    """The request's cost counted as waiting while the block runs (:func:`reserve`)."""
    reserve(waiting, cost, limits)
    try:
        yield
    finally:
        waiting["work"] -= cost.work
        waiting["values"] -= cost.values


def model_info(translator: Translator, limits: Limits) -> dict:
    """What a client needs to know: languages, size, what the model can show, the limits."""
    engine, config = translator.engine, translator.config
    layers, heads = engine.attention_grid or (0, 0)
    return {"model": engine.description, "engine": engine.name, "src_lang": config.data.src_lang,
            "tgt_lang": config.data.tgt_lang, "target_langs": list(config.data.target_langs),
            "parameters": engine.num_parameters(),
            "has_attention": engine.attention_grid is not None, "layers": layers, "heads": heads,
            "has_self_attention": engine.has_self_attention,
            "max_source_tokens": engine.max_source_tokens, "default_beam": config.decode.beam,
            "tokenizer": translator.target_tokenizer.kind,
            "limits": {"max_chars": limits.max_chars, "max_texts": limits.max_texts,
                       "max_beam": limits.max_beam, "max_n_best": limits.max_n_best,
                       "max_work": limits.max_work,
                       "max_response_values": limits.max_response_values}}


class RequestGate:
    """ASGI middleware that bounds what requests hold before the app sees them: at most
    ``max_connections`` requests in progress (``GET /health`` always passes, so a monitor
    sees the server alive) and ``max_inflight_body_bytes`` of bodies arriving (by their
    declared size), 503 with ``Retry-After`` past either; a body over ``max_body_bytes`` is
    413 (by its Content-Length, or once more has arrived); a body still arriving after
    ``body_timeout`` seconds is 408, and the connection closed. The body is read here, whole,
    and handed to the app."""

    def __init__(self, app, limits: Limits):
        self.app, self.limits = app, limits
        self.in_progress, self.inflight_bytes = 0, 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["method"] == "GET" and scope["path"] == "/health":
            return await self.app(scope, receive, send)
        if self.in_progress >= self.limits.max_connections:
            return await self._refuse(scope, receive, send, 503, f"busy: {self.in_progress} "
                                      f"requests in progress (max_connections "
                                      f"{self.limits.max_connections}); retry shortly")
        self.in_progress += 1
        try:
            await self._admit(scope, receive, send)
        finally:
            self.in_progress -= 1

    async def _admit(self, scope, receive, send):
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or
                                     int(declared) > self.limits.max_body_bytes):
            return await self._refuse(scope, receive, send, 413, f"request body over "
                                      f"max_body_bytes {self.limits.max_body_bytes}")
        size = self.limits.max_body_bytes if declared is None else int(declared)
        if self.inflight_bytes + size > self.limits.max_inflight_body_bytes:
            return await self._refuse(scope, receive, send, 503, f"busy: {self.inflight_bytes} "
                                      "bytes of request bodies arriving (max_inflight_body_bytes "
                                      f"{self.limits.max_inflight_body_bytes}); retry shortly")
        self.inflight_bytes += size
        try:
            body = await asyncio.wait_for(self._read_body(receive), self.limits.body_timeout)
        except asyncio.TimeoutError:
            return await self._refuse(scope, receive, send, 408, f"the request body did not "
                                      f"arrive within body_timeout {self.limits.body_timeout:g} s")
        except ConnectionAbortedError:
            return
        finally:
            self.inflight_bytes -= size
        if body is None:
            return await self._refuse(scope, receive, send, 413, f"request body over "
                                      f"max_body_bytes {self.limits.max_body_bytes}")
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _read_body(self, receive) -> bytes | None:
        """The whole body, or None once it passes ``max_body_bytes``."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":             # the client left
                raise ConnectionAbortedError
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limits.max_body_bytes:
                return None
            if not message.get("more_body"):
                return b"".join(chunks)

    @staticmethod
    async def _refuse(scope, receive, send, status: int, message: str):
        headers = {"Connection": "close"}
        if status == 503:
            headers["Retry-After"] = "1"
        await JSONResponse({"error": message}, status_code=status, headers=headers)(
            scope, receive, send)


@dataclass
class Served:
    """One model of the server: its translator, its executor and micro-batcher, its /info."""
    name: str
    translator: Translator
    executor: concurrent.futures.Executor
    batcher: MicroBatcher | None
    info: dict
    default_beam: int

    @classmethod
    def start(cls, name: str, translator: Translator, limits: Limits, micro_batch: bool,
              wait_ms: float, workers: int) -> "Served":
        workers = workers or default_workers(translator)
        executor = concurrent.futures.ThreadPoolExecutor(max_workers=workers)
        batcher = MicroBatcher(translator, executor, wait_ms, limits.max_texts, workers) \
            if micro_batch else None
        return cls(name, translator, executor, batcher, {"name": name, **model_info(translator, limits)},
                   min(translator.config.decode.beam, limits.max_beam))

    async def translate(self, texts: list[str], options: Options, client: str = "",
                        finish: Callable[[list[Translation]], object] | None = None,
                        work: int = 0):
        """The translations, or what ``finish`` makes of them in the worker (see
        :meth:`MicroBatcher.translate`); ``client``: who asks (an API key, else an
        address), for the batcher's fair shares; ``work``: the request's decoding work."""
        if self.batcher is not None:
            return await self.batcher.translate(texts, options, client, finish, work)
        translations = await run_translation(self.translator, self.executor, texts, options)
        if finish is None:
            return translations
        return await asyncio.get_running_loop().run_in_executor(self.executor, finish,
                                                                translations)

    def options(self, request: TranslateRequest, texts: list[str]) -> Options:
        """The request's decoding options, checked against this model (422 naming the field)."""
        if request.self_attention and not self.info["has_self_attention"]:
            raise LimitError(422, "self_attention: this model has no self-attention")
        sampling = None if request.sample is None else Sampling(**request.sample.model_dump())
        for field, check in (("target_lang", lambda: self.translator.source_tag(request.target_lang)),
                             ("prefix", lambda: request.prefix is None or self.translator.prefix_ids(
                                 request.prefix, self.translator.source_tokenizer.encode_batch(texts))),
                             ("trace", lambda: not request.trace or self.translator.check_trace(sampling))):
            try:
                check()
            except UserError as error:
                raise LimitError(422, f"{field}: {error}") from None
        return Options(request.beam or self.default_beam, request.n_best, request.alpha,
                       request.attention or request.self_attention, sampling, request.target_lang,
                       request.prefix, request.trace, request.self_attention)


def served_models(translators: Translator | dict[str, Translator]) -> dict[str, Translator]:
    return translators if isinstance(translators, dict) else {"model": translators}


def create_app(translators: Translator | dict[str, Translator], limits: Limits = Limits(),
               micro_batch: bool = True, wait_ms: float = 5.0, workers: int = 0,
               api_keys: libre.ApiKeys | None = None, client_rate: int = 0) -> FastAPI:
    """The API over one translator or several (``{name: translator}``, the first the default;
    a request's ``model`` names another). ``workers``: batches decoded at once per model
    (0: :func:`default_workers`); more than one only pays on an engine that runs them in
    parallel (CTranslate2, whose threads each take a batch). ``api_keys``: when given,
    ``/translate`` and ``/detect`` need one of its keys and keep to its request rate.
    ``client_rate``: requests per minute each client address may make to them (0: any)."""
    # No /docs or /redoc: their pages load scripts from the internet (blank offline).
    app = FastAPI(title="attnmt", description="Attention-based NMT with an attention viewer",
                  docs_url=None, redoc_url=None)
    app.add_middleware(RequestGate, limits=limits)
    models = {name: Served.start(name, translator, limits, micro_batch, wait_ms, workers)
              for name, translator in served_models(translators).items()}
    default = next(iter(models.values()))
    info = {**default.info, "models": [model.info for model in models.values()],
            "api_keys": api_keys is not None}
    waiting = {"work": 0, "values": 0}             # accepted and not yet answered, all models
    page = resources.files("attnmt").joinpath("static/index.html").read_text(encoding="utf-8")
    documents_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)  # parse, split, encode
    libre_api = LibreTranslateApi(models, limits, waiting, documents_pool)
    clients = libre.RateWindow()

    refusals = RefusalDelay(limits.refusal_delay)

    async def refuse(error: Exception, request: Request, libre_shape: bool) -> JSONResponse:
        """The error's answer (:func:`error_response`), held back by :class:`RefusalDelay`
        when the request's address was refused a moment ago."""
        response = error_response(error, libre_shape)
        if 400 <= response.status_code < 500 or response.status_code == 503:
            await refusals.hold(request.client.host if request.client else "unknown")
        return response

    def admit_client(request: Request) -> None:
        if client_rate:
            address = request.client.host if request.client else "unknown"
            clients.admit(address, client_rate, "a client")

    @app.get("/", response_class=HTMLResponse)
    async def index():
        return page

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/info")
    async def get_info():
        return info

    @app.get("/languages")
    async def get_languages():
        return libre.languages(libre_api.pairs)

    @app.get("/frontend/settings")
    async def frontend_settings():
        return libre.frontend_settings(libre_api.pairs, api_keys is not None)

    @app.post("/detect")
    async def detect(request: Request):
        try:
            admit_client(request)
            found = await libre.parameters(request)
            if api_keys is not None:
                api_keys.admit(found.get("api_key"))
            return await libre_api.detect(found)
        except Exception as error:
            return await refuse(error, request, libre_shape=True)

    @app.post("/translate")
    async def translate(request: Request):
        try:
            admit_client(request)
            try:                                       # the body is parsed once, for both shapes
                parsed, unreadable = libre.read_json(await request.body()), None
            except ValueError as error:
                parsed, unreadable = None, error
        except Exception as error:
            return await refuse(error, request, libre_shape=True)
        if libre.is_libretranslate(request.headers.get("content-type", ""),
                                   request.query_params, parsed):
            return await translate_libre(request, parsed)
        try:
            translation_request = read_translate_request(parsed, unreadable)
            if api_keys is not None:
                api_keys.admit(translation_request.api_key)
            model = models.get(translation_request.model or default.name)
            if model is None:
                raise LimitError(422, f"model: unknown model {translation_request.model!r}; "
                                      f"this server has {', '.join(models)}")
            texts = check_request(translation_request, limits, model.default_beam)
            options = model.options(translation_request, texts)
            cost = request_cost(model.translator, texts, options)
            check_cost(cost, limits)
            with reserved(waiting, cost, limits):
                body = await _translate(model, texts, options, cost.work,
                                        client_of(request, translation_request.api_key
                                                  if api_keys else None))
        except Exception as error:
            return await refuse(error, request, libre_shape=False)
        return Response(body, media_type="application/json")

    async def translate_libre(request: Request, parsed: object):
        try:
            found = await libre.parameters(request, parsed)
            if api_keys is not None:
                api_keys.admit(found.get("api_key"))
            libre_request = libre.read_request(found)
            return await libre_api.translate(libre_request,
                                             client_of(request, libre_request.api_key
                                                       if api_keys else None))
        except Exception as error:
            return await refuse(error, request, libre_shape=True)

    async def _translate(model: Served, texts: list[str], options: Options, work: int,
                         client: str) -> bytes:
        """The response body: self-attention maps and the JSON rendered in the model's
        worker after decoding, off the event loop, their time counted in the client's share."""
        def finish(translations: list[Translation]) -> bytes:
            maps = [model.translator.self_attention(translation)
                    if options.self_attention and translation.best.ids else None
                    for translation in translations]
            return render(model.name, translations, options.attention, maps)

        return await model.translate(texts, options, client, finish, work)

    return app


class RefusalDelay:
    """Refusals in a loop cost the server (and its other clients) as much as answers: an
    address refused again within ``seconds`` of its last refusal gets the next one only
    after ``seconds``, which costs the server nothing (the request waits on the event
    loop). A client that corrects its request is not slowed; one that ignores the answers
    and sends them again is held to about one refusal per ``seconds`` per connection. The
    10,000 most recently refused addresses are remembered."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.last: collections.OrderedDict[str, float] = collections.OrderedDict()

    async def hold(self, address: str) -> None:
        loop = asyncio.get_running_loop()
        last = self.last.pop(address, None)
        if self.seconds and last is not None and loop.time() - last < self.seconds:
            self.last[address] = loop.time() + self.seconds
            await asyncio.sleep(self.seconds)
        self.last[address] = loop.time()
        while len(self.last) > MOST_CLIENTS_REMEMBERED:
            self.last.popitem(last=False)


def client_of(request: Request, api_key: str | None) -> str:
    """Who sends a request, for fair shares: its API key (a key the server checked), else
    its address."""
    if api_key:
        return f"key {api_key}"
    return f"address {request.client.host if request.client else 'unknown'}"


def error_response(error: Exception, libre_shape: bool) -> JSONResponse:
    """The one answer to every error of a request, ``{"error": message}``: a limit's or a
    LibreTranslate error's own status (LibreTranslate answers 400 where attnmt says 413 or
    422: ``libre_shape``), 422 (400) for what the user can change, and 500 otherwise."""
    if isinstance(error, libre.ApiError):
        error = LimitError(error.status, error.message, error.retry_after)
    elif isinstance(error, UserError):
        error = LimitError(422, str(error))
    elif not isinstance(error, LimitError):
        logger.error("translation failed", exc_info=error)
        error = LimitError(500, "internal error while translating")
    if libre_shape and error.status in (413, 422):
        error = LimitError(400, error.message, error.retry_after)
    return error.response()


ON_THE_LOOP = 2000     # characters: a longer LibreTranslate request is prepared in a thread


@dataclass
class _Text:
    """One text of a LibreTranslate request: the model that translates it, its sentences, and
    how to put their translations back (into the text's layout, or into its HTML)."""
    route: libre.Route
    sentences: list[str]
    rebuild: Callable[[list[str]], str]
    detected: dict | None = None


def check_splittable(texts: list[str], most_sentences: int, limits: Limits) -> None:
    """413 before splitting when ``texts`` hold more than ``most_sentences`` sentences of up
    to ``max_chars`` could: more non-space characters, or more lines with text (a line break
    ends a sentence). Splitting is linear, and this bounds its length."""
    characters = sum(len(text) - sum(map(len, re.findall(r"\s+", text))) for text in texts)
    lines = sum(1 for text in texts for line in text.split("\n") if line.strip())
    if characters > most_sentences * limits.max_chars or lines > most_sentences:
        raise LimitError(413, f"the text has {characters} characters on {lines} lines; the work "
                              f"budget holds at most {most_sentences} sentences (max_work "
                              f"{limits.max_work}) of up to max_chars {limits.max_chars}; send "
                              "less text")


def _rebuilder(split: list[tuple[list[str], list[str]]],
               document: documents.HtmlDocument | None) -> Callable[[list[str]], str]:
    """How a text comes back from its sentences' translations: each run's sentences joined
    into its layout (``split``: each run's sentences and gaps), the runs written into the
    HTML ``document`` (or the one run, for plain text)."""
    def rebuild(out: list[str]) -> str:
        joined, start = [], 0
        for sentences, gaps in split:
            joined.append(documents.join_sentences(out[start:start + len(sentences)], gaps))
            start += len(sentences)
        return joined[0] if document is None else document.rebuild(joined)

    return rebuild


class LibreTranslateApi:
    """LibreTranslate's ``/translate`` and ``/detect`` over the served models: the pair picks
    the model, texts are cut into sentences, and the sentences of a request are decoded as one
    batch under the server's limits (each sentence up to ``max_chars``; the work and response
    budgets, and what is waiting, for the whole request, its documents counted by their size
    in the response budget, once per alternative). Long documents are parsed, split, rebuilt
    and encoded in ``documents``, a thread of their own, never on the event loop."""

    def __init__(self, models: dict[str, Served], limits: Limits, waiting: dict,
                 documents_pool: concurrent.futures.Executor):
        self.models, self.limits, self.waiting = models, limits, waiting
        self.documents_pool = documents_pool
        self.pairs = libre.language_pairs({name: m.translator for name, m in models.items()})
        self.detector: libre.LanguageDetector | None = None

    def _detector(self) -> libre.LanguageDetector:
        if self.detector is None:                     # its model takes a second to load
            self.detector = libre.LanguageDetector(sorted({s for s, _ in self.pairs}))
        return self.detector

    async def detect(self, found: dict) -> list[dict]:
        text = found.get("q")
        if not isinstance(text, str):
            raise libre.ApiError(400, "Invalid request: q must be one text")
        try:
            libre.valid_unicode(text)
        except ValueError as error:
            raise libre.ApiError(400, f"Invalid request: q {error}") from None
        ranked = self._detector().rank(text[:self.limits.max_chars * 10])
        return [{"confidence": confidence, "language": lang} for lang, confidence in ranked]

    def route(self, source: str, target: str, text: str) -> tuple[libre.Route, dict | None]:
        """The model for ``source`` -> ``target`` (``source`` ``auto``: the detected language
        among those served into ``target``), and the detection to report."""
        if source != "auto":
            if (source, target) not in self.pairs:
                raise libre.ApiError(400, f"no model translates {source} into {target}; this "
                                          f"server translates {libre.describe_pairs(self.pairs)}")
            return self.pairs[source, target], None
        sources = [s for s, t in self.pairs if t == target]
        if not sources:
            raise libre.ApiError(400, f"no model translates into {target}; this server "
                                      f"translates {libre.describe_pairs(self.pairs)}")
        ranked = self._detector().rank(text[:self.limits.max_chars * 10], sources) or \
            [(sources[0], 0.0)]
        lang, confidence = ranked[0]
        return self.pairs[lang, target], {"confidence": confidence, "language": lang}

    def most_sentences(self, n_best: int) -> int:
        """The most sentences of at least one token a request's work budget can hold, on the
        served model where a sentence costs least."""
        least = min(max(m.default_beam, n_best) * m.translator.search_options().output_limit(1)
                    for m in self.models.values())
        return self.limits.max_work // least

    def prepare(self, texts: list[str], request: libre.LibreRequest, n_best: int) -> list[_Text]:
        """Each text cut into sentences with its model chosen; every bound checked before the
        work it bounds (the tags counted before parsing, the text before splitting)."""
        if request.format == "text":
            runs = [[text] for text in texts]
        else:
            parsed = []
            for number, text in enumerate(texts, start=1):
                if text.count("<") > self.limits.max_html_tags:
                    raise LimitError(413, f"text {number} has {text.count('<')} tags > "
                                          f"max_html_tags {self.limits.max_html_tags}")
                try:
                    parsed.append(documents.parse_html(text))
                except documents.MalformedHtml as error:
                    raise libre.ApiError(400, f"Invalid request: text {number} is HTML this "
                                              f"server cannot rebuild: {error}") from None
            runs = [document.texts for document in parsed]
        check_splittable([run for text in runs for run in text], self.most_sentences(n_best),
                         self.limits)
        prepared = []
        for index, text_runs in enumerate(runs):
            route, detected = self.route(request.source, request.target, " ".join(text_runs))
            language = detected["language"] if detected else request.source
            split = [documents.split_sentences(run, language) for run in text_runs]
            prepared.append(_Text(route, [s for sentences, _ in split for s in sentences],
                                  _rebuilder(split, None if request.format == "text"
                                             else parsed[index]), detected))
        return prepared

    async def translate(self, request: libre.LibreRequest, client: str = "") -> Response:
        texts = [request.q] if isinstance(request.q, str) else request.q
        if len(texts) > self.limits.max_texts:
            raise LimitError(413, f"too many texts: {len(texts)} > max_texts {self.limits.max_texts}")
        n_best = 1 + request.alternatives
        most = min(self.limits.max_beam, self.limits.max_n_best)
        if n_best > most:
            raise libre.ApiError(400, f"Invalid request: alternatives must be at most {most - 1}")
        characters = sum(map(len, texts))
        size = characters * n_best                           # what the answer re-emits
        if size > self.limits.max_response_values:
            raise LimitError(413, f"the texts have {characters} characters, "
                                  f"{size} with alternatives > max_response_values "
                                  f"{self.limits.max_response_values}; send less text or ask "
                                  "for fewer alternatives")
        loop = asyncio.get_running_loop()

        async def off_the_loop(work):
            """Long documents are handled in a thread of their own, so that /health and short
            requests answer meanwhile; a few sentences cost less than the hand-over."""
            if characters <= ON_THE_LOOP:
                return work()
            return await loop.run_in_executor(self.documents_pool, work)

        prepared = await off_the_loop(lambda: self.prepare(texts, request, n_best))
        outputs = await self._decode(prepared, n_best, size, client)

        def answer() -> bytes:
            results = [self._describe(text, out, request.alternatives)
                       for text, out in zip(prepared, outputs)]
            if isinstance(request.q, str):
                body = results[0]
            else:
                body = {key: [result[key] for result in results] for key in results[0]} \
                    if results else {"translatedText": []}
            return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

        return Response(await off_the_loop(answer), media_type="application/json")

    async def _decode(self, prepared: list[_Text], n_best: int, size: int,
                      client: str) -> list[list[Translation]]:
        """Each text's sentences translated, one batch per model; the costs of all the
        request's batches and its documents' ``size`` checked and reserved together."""
        by_route: dict[libre.Route, list[str]] = {}
        for text in prepared:
            by_route.setdefault(text.route, []).extend(text.sentences)
        batches = []
        for route, sentences in by_route.items():
            model = self.models[route.model]
            for number, sentence in enumerate(sentences, start=1):
                if len(sentence) > self.limits.max_chars:
                    raise LimitError(413, f"sentence {number} has {len(sentence)} characters > "
                                          f"max_chars {self.limits.max_chars}")
            options = Options(max(model.default_beam, n_best), n_best, None, False,
                              target_lang=route.target_lang)
            batches.append((route, model, sentences, options,
                            request_cost(model.translator, sentences, options)))
        parts = {"documents": size}
        for *_, cost in batches:
            parts = {key: parts.get(key, 0) + cost.parts.get(key, 0)
                     for key in {**parts, **cost.parts}}
        total = Cost(sum(cost.work for *_, cost in batches), parts)
        check_cost(total, self.limits)
        decoded = {}
        with reserved(self.waiting, total, self.limits):
            for route, model, sentences, options, cost in batches:
                decoded[route] = iter(await model.translate(sentences, options, client,
                                                            work=cost.work)
                                      if sentences else [])
        return [[next(decoded[text.route]) for _ in text.sentences] for text in prepared]

    @staticmethod
    def _describe(text: _Text, translations: list[Translation], alternatives: int) -> dict:
        result = {"translatedText": text.rebuild([t.best.text for t in translations])}
        if text.detected is not None:
            result["detectedLanguage"] = text.detected
        if alternatives:
            others = []
            for rank in range(1, alternatives + 1):
                other = text.rebuild([t.hypotheses[min(rank, len(t.hypotheses) - 1)].text
                                      for t in translations])
                if other not in others and other != result["translatedText"]:
                    others.append(other)
            result["alternatives"] = others
        return result


def default_workers(translator: Translator) -> int:
    """One worker for the PyTorch engine (its threads share each batch); for CTranslate2, as
    many as the engine has threads, each decoding a batch of its own."""
    return translator.engine.parallel_batches


def serve(translators: Translator | dict[str, Translator], host: str, port: int, limits: Limits,
          micro_batch: bool, wait_ms: float, workers: int = 0,
          api_keys: libre.ApiKeys | None = None, client_rate: int = 0,
          forwarded_allow_ips: str = "") -> None:
    """Run the app with uvicorn. Proxy headers (``X-Forwarded-For``) are read only from the
    addresses in ``forwarded_allow_ips`` (uvicorn would trust 127.0.0.1's by default, so that
    anything on the host forwarding the header could choose its client address)."""
    import uvicorn

    app = create_app(translators, limits, micro_batch, wait_ms, workers, api_keys, client_rate)
    uvicorn.run(app, host=host, port=port, log_level="warning",
                limit_concurrency=2 * limits.max_connections,   # connections, idle ones too
                proxy_headers=bool(forwarded_allow_ips),
                forwarded_allow_ips=forwarded_allow_ips or None)
