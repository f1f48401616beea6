"""LibreTranslate's API, spoken by attnmt's server: the requests its clients send and the
answers they expect, the language pairs of the loaded models, language detection and
API keys with a request rate each.

LibreTranslate (https://libretranslate.com) answers ``POST /translate`` (``q``,
``source``, ``target``, ``format``, ``alternatives``, ``api_key``), ``GET /languages`` and
``POST /detect``; its clients send the parameters as JSON, as a form, or in the query
string. Texts are cut into sentences (:mod:`attnmt.documents`) and the sentences of a
request decoded as one batch, under the same limits as attnmt's own requests.
"""
from __future__ import annotations

import collections
import json
import math
import threading
import time
import urllib.parse
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException

from attnmt.errors import UserError

# English names of the languages a served model may speak, for /languages (ISO 639-1).
LANGUAGE_NAMES = {
    "ar": "Arabic", "bg": "Bulgarian", "ca": "Catalan", "cs": "Czech", "da": "Danish",
    "de": "German", "el": "Greek", "en": "English", "es": "Spanish", "et": "Estonian",
    "fi": "Finnish", "fr": "French", "he": "Hebrew", "hi": "Hindi", "hu": "Hungarian",
    "id": "Indonesian", "it": "Italian", "ja": "Japanese", "ko": "Korean", "lt": "Lithuanian",
    "lv": "Latvian", "nl": "Dutch", "no": "Norwegian", "pl": "Polish", "pt": "Portuguese",
    "ro": "Romanian", "ru": "Russian", "sk": "Slovak", "sl": "Slovenian", "sv": "Swedish",
    "tr": "Turkish", "uk": "Ukrainian", "vi": "Vietnamese", "zh": "Chinese",
}
FIELDS = ("q", "source", "target", "format", "alternatives", "api_key")
MAX_FORM_FIELDS = 100


class ApiError(Exception):
    """An answer in LibreTranslate's error shape, ``{"error": message}``."""

    def __init__(self, status: int, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after


def valid_unicode(text: str) -> str:
    """``text``, or a ValueError (a 4xx naming the field) if it holds a lone UTF-16
    surrogate, which a JSON body may escape but no UTF-8 can carry."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (it holds a lone UTF-16 surrogate)") from None
    return text


MAX_INTEGER_DIGITS = 32      # no field needs more; Python refuses over 4,300, after the work


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise ValueError(f"an integer of {len(digits)} digits (at most {MAX_INTEGER_DIGITS})")
    return int(digits)


def read_json(body: bytes) -> object:
    """A JSON body, its integers bounded in size (each checked before it is converted) and its
    nesting by the parser's own recursion limit (a RecursionError, at depth 1000, in linear
    time); ValueError naming what is wrong. An empty body is an empty object."""
    if not body.strip():
        return {}
    try:
        return json.loads(body, parse_int=_bounded_int)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"JSON decode error ({error})") from None


class LibreRequest(BaseModel):
    """A LibreTranslate ``/translate`` request; unknown fields are ignored, as it does."""
    model_config = ConfigDict(extra="ignore")
    q: str | list[str]
    source: str = "auto"
    target: str
    format: Literal["text", "html"] = "text"
    alternatives: int = Field(default=0, ge=0)
    api_key: str | None = None

    @field_validator("q")
    @classmethod
    def _q(cls, value):
        for text in [value] if isinstance(value, str) else value:
            valid_unicode(text)
        return value


def is_libretranslate(content_type: str, query: dict, body: object) -> bool:
    """Whether a ``/translate`` request has LibreTranslate's shape: a form body, or
    LibreTranslate's fields in the query string or the JSON body (attnmt's own requests
    have ``text`` or ``texts``)."""
    if content_type.startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
        return True
    return any(name in query for name in FIELDS) or (
        isinstance(body, dict) and any(name in body for name in ("q", "source", "target")))


async def parameters(request, parsed: object = None) -> dict:
    """The request's parameters, from its query string and its body (JSON or form), the
    body's winning; 400 when the body cannot be read. ``parsed``: the JSON body, when the
    caller has parsed it already."""
    found = dict(request.query_params)
    content_type = request.headers.get("content-type", "")
    try:
        if content_type.startswith("application/x-www-form-urlencoded"):
            body = (await request.body()).decode("utf-8")
            found.update(urllib.parse.parse_qsl(body, keep_blank_values=True, errors="strict",
                                                  max_num_fields=MAX_FORM_FIELDS))
        elif content_type.startswith("multipart/form-data"):
            form = await request.form(max_files=0, max_fields=MAX_FORM_FIELDS)
            found.update({key: value for key, value in form.items() if isinstance(value, str)})
        else:
            if parsed is None:
                parsed = read_json(await request.body())
            if not isinstance(parsed, dict):
                raise ApiError(400, "Invalid request: the body must be a JSON object")
            found.update(parsed)
    except (ValueError, HTTPException, MultiPartException) as error:
        detail = getattr(error, "detail", None) or error  # Starlette's form errors say it there
        raise ApiError(400, f"Invalid request: the body cannot be read ({detail})") from None
    return found


def read_request(found: dict) -> LibreRequest:
    """The parameters as a :class:`LibreRequest`; 400 naming the field otherwise."""
    if "q" not in found:
        raise ApiError(400, "Invalid request: missing q parameter")
    if "target" not in found:
        raise ApiError(400, "Invalid request: missing target parameter")
    try:
        return LibreRequest.model_validate(found)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                             for e in error.errors())
        raise ApiError(400, f"Invalid request: {problems}") from None


@dataclass(frozen=True)
class Route:
    """The served model that translates a language pair, and the target language to ask it
    for (None for a model with one target language)."""
    model: str
    target_lang: str | None


def language_pairs(models: dict) -> dict[tuple[str, str], Route]:
    """``{(source, target): Route}`` over the served translators (``{name: Translator}``):
    a many-to-one model serves each of its source languages, a one-to-many each target; where
    two models serve one pair, the first named wins."""
    pairs = {}
    for name, translator in models.items():
        data = translator.config.data
        many_targets = len(data.target_langs) > 1
        for source in (data.src_lang, *data.extra_src_langs):
            for target in data.target_langs:
                pairs.setdefault((source, target),
                                 Route(name, target if many_targets else None))
    return pairs


def describe_pairs(pairs: dict) -> str:
    return ", ".join(f"{source}->{target}" for source, target in pairs)


def languages(pairs: dict) -> list[dict]:
    """``GET /languages``: each source language with its name and its targets."""
    targets: dict[str, list[str]] = {}
    for source, target in pairs:
        targets.setdefault(source, []).append(target)
    return [{"code": code, "name": LANGUAGE_NAMES.get(code, code), "targets": sorted(found)}
            for code, found in sorted(targets.items())]


def frontend_settings(pairs: dict, keys: bool) -> dict:
    """``GET /frontend/settings``, which some clients read before they translate: whether a
    key is needed, and no file translation or suggestions (attnmt has neither)."""
    source, target = next(iter(pairs))
    return {"apiKeys": keys, "keyRequired": keys, "charLimit": -1, "frontendTimeout": 500,
            "suggestions": False, "filesTranslation": False, "supportedFilesFormat": [],
            "language": {"source": {"code": source, "name": LANGUAGE_NAMES.get(source, source)},
                         "target": {"code": target, "name": LANGUAGE_NAMES.get(target, target)}}}


class LanguageDetector:
    """Which served source language a text is in, by ``py3langid`` (a naive Bayes model over
    byte n-grams, shipped in its wheel), restricted to the languages it may choose from."""

    def __init__(self, candidates: list[str]):
        from py3langid.langid import MODEL_FILE, LanguageIdentifier

        self.identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        self.candidates = sorted(set(candidates) & set(self.identifier.labels))
        self.lock = threading.Lock()              # set_languages changes the identifier
        self.restricted_to: tuple[str, ...] | None = None

    def rank(self, text: str, among: list[str] | None = None) -> list[tuple[str, float]]:
        """``[(language, confidence in percent)]``, best first, among ``among`` (default: the
        candidates); an empty list when none of them can be detected."""
        chosen = tuple(sorted(set(among or self.candidates) & set(self.candidates)))
        if not chosen:
            return []
        if len(chosen) == 1:
            return [(chosen[0], 100.0)]
        with self.lock:
            if chosen != self.restricted_to:
                self.identifier.set_languages(list(chosen))
                self.restricted_to = chosen
            ranked = self.identifier.rank(text)
        return [(lang, round(100 * score, 2)) for lang, score in ranked]


@dataclass
class RateWindow:
    """Requests per minute per key (an API key, a client's address), over a sliding minute.
    At most ``most_keys`` keys are remembered, the least recently seen forgotten first, so a
    request costs the same however many keys have been seen."""
    recent: collections.OrderedDict = field(default_factory=collections.OrderedDict)
    most_keys: int = 10_000

    def admit(self, key: str, limit: int, who: str, now: float | None = None) -> None:
        """Count a request of ``key``, or 429 with the seconds until its oldest request of
        the last minute leaves the window."""
        now = time.monotonic() if now is None else now
        recent = self.recent.pop(key, None) or deque(maxlen=limit)
        self.recent[key] = recent                     # now the most recently seen
        while len(self.recent) > self.most_keys:
            self.recent.popitem(last=False)
        while recent and recent[0] <= now - 60:
            recent.popleft()
        if len(recent) >= limit:
            wait = max(1, math.ceil(recent[0] + 60 - now))
            raise ApiError(429, f"Slowdown: {who} may make {limit} requests per minute; "
                                f"retry in {wait} s", retry_after=wait)
        recent.append(now)


@dataclass
class ApiKeys:
    """The keys a server accepts, each with its requests per minute (0: no limit)."""
    per_minute: dict[str, int]
    window: RateWindow = field(default_factory=RateWindow)

    @classmethod
    def from_file(cls, path: str | Path) -> "ApiKeys":
        """One key per line, optionally followed by its requests per minute; ``#`` starts a
        comment. A line that is neither is a :class:`UserError` naming it."""
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise UserError(f"--api-keys {path}: cannot read it ({error})") from None
        per_minute = {}
        for number, line in enumerate(lines, start=1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if len(words) > 2 or (len(words) == 2 and not words[1].isdigit()):
                raise UserError(f"--api-keys {path}, line {number}: expected 'KEY' or "
                                f"'KEY REQUESTS_PER_MINUTE', got {line.strip()!r}")
            per_minute[words[0]] = int(words[1]) if len(words) == 2 else 0
        if not per_minute:
            raise UserError(f"--api-keys {path}: the file lists no key")
        return cls(per_minute)

    def admit(self, key: str | None, now: float | None = None) -> None:
        """403 for a missing or unknown key; 429 with the seconds to wait when the key has
        made its requests of the last minute."""
        if key is not None and not isinstance(key, str):
            raise ApiError(400, "Invalid request: api_key must be a string")
        if not key:
            raise ApiError(403, "Please provide an API key (api_key)")
        if key not in self.per_minute:
            raise ApiError(403, "Invalid API key")
        if self.per_minute[key]:
            self.window.admit(key, self.per_minute[key], "this key", now)
