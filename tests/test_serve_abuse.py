"""The server under malformed and pathological requests: every one answered in the API's
error shape, and none costing more than linear time before a bound refuses it."""
import html
import json
import re
import socket
import sys
import time
import urllib.error
import urllib.request

import pytest
from fastapi.testclient import TestClient

from attnmt import documents
from attnmt.documents import MalformedHtml, parse_html, split_sentences
from attnmt.libretranslate import ApiKeys
from attnmt.serve import create_app
from attnmt.translator import Translator
from test_serve import free_port, start_server


@pytest.fixture(scope="module")
def client(tiny_runs):
    app = create_app({"de_en": Translator.from_run(tiny_runs["transformer"])},
                     api_keys=ApiKeys({"alice": 0}))
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


def libre(**fields) -> dict:
    return {"source": "de", "target": "en", "api_key": "alice", **fields}


JSON = {"Content-Type": "application/json"}
MALFORMED = [
    ("/translate", b"[" * 50000, JSON),                                   # RecursionError
    ("/detect", b"[" * 50000, JSON),
    ("/translate", b'{"text": "x", "api_key": "alice", "beam": ' + b"9" * 5000 + b"}", JSON),
    ("/translate", b'{"q": "x", "target": "en", "api_key": "alice", "alternatives": '
     + b"9" * 5000 + b"}", JSON),
    ("/detect", b'{"q": "Hallo", "api_key": ["alice"]}', JSON),            # a key not a string
    ("/translate", b'{"q": "Hallo", "target": "en", "api_key": {"a": 1}}', JSON),
    ("/translate", b'{"text": "Hallo", "api_key": {"a": 1}}', JSON),
    ("/translate", b"x", {"Content-Type": "multipart/form-data"}),         # no boundary
    ("/detect", b"x", {"Content-Type": "multipart/form-data"}),
    ("/translate", b"&".join([b"q=a"] * 1000) + b"&target=en",
     {"Content-Type": "application/x-www-form-urlencoded"}),              # too many fields
]


@pytest.mark.parametrize("path,body,headers", MALFORMED)
def test_a_malformed_body_is_a_4xx_in_the_error_shape(client, path, body, headers):
    answer = client.post(path, content=body, headers=headers)
    assert answer.status_code in (400, 422), answer.text
    assert list(answer.json()) == ["error"] and answer.json()["error"]
    assert client.get("/health").status_code == 200


@pytest.mark.parametrize("markup", ["<![<![", "<p>Hallo</p><![x<![", "<p>eins<a", "<b>zwei<!--",
                                    "<script><!--<script></script>var x = 1;</script><p>drei</p>"])
def test_html_the_server_cannot_rebuild_is_400(client, markup):
    answer = client.post("/translate", json=libre(q=markup, format="html"))
    assert answer.status_code == 400 and "cannot rebuild" in answer.json()["error"], answer.text


def test_pathological_texts_are_refused_before_they_are_split(client, monkeypatch):
    split = []
    monkeypatch.setattr(documents, "split_sentences",
                        lambda *args: split.append(1) or pytest.fail("split before refused"))
    for text in ["aaaaa. " * 50_000, "zwei\n" * 50_000]:
        answer = client.post("/translate", json=libre(q=text))
        assert answer.status_code == 400 and "work budget holds at most" in answer.json()["error"]
    answer = client.post("/translate", json=libre(q="<b>x" * 16_000, format="html"))
    assert answer.status_code == 400 and "max_html_tags" in answer.json()["error"]
    assert not split


def test_alternatives_count_the_documents_they_repeat(client):
    document = '<p title="' + "a" * 90_000 + '">drei</p>'
    assert client.post("/translate", json=libre(q=document, format="html")).status_code == 200
    answer = client.post("/translate", json=libre(q=document, format="html", alternatives=9))
    assert answer.status_code == 400 and "alternatives" in answer.json()["error"], answer.text


def cpu_seconds(work, *args) -> float:
    """The least CPU time of three calls (the machine's noise only adds)."""
    least = float("inf")
    for _ in range(3):
        start = time.process_time()
        try:
            work(*args)
        except MalformedHtml:
            pass
        least = min(least, time.process_time() - start)
    return least


GROWING = {
    "full stops without spaces": lambda n: "aaaaa." * (n // 6) + "x B",
    "one long word": lambda n: "a" * n + ". B",
    "sentences": lambda n: "Ein Hund rennt. " * (n // 16),
    "quotes and stops": lambda n: '"«. ' * (n // 4) + "B",
}
GROWING_HTML = {
    "nested tags": lambda n: "<b>x" * (n // 4),
    "unclosed tags": lambda n: "<a" * (n // 2),
    "unclosed attribute": lambda n: '<p title="' + "<a " * (n // 3),
    "paragraphs": lambda n: "<p>Ein Hund rennt.</p>" * (n // 22),
    "character references": lambda n: "&amp;" * (n // 5),
}


@pytest.mark.parametrize("name", GROWING)
def test_splitting_grows_linearly(name):
    small, large = (cpu_seconds(split_sentences, GROWING[name](n), "de") for n in (16_000, 256_000))
    assert large <= 40 * max(small, 1e-3), f"{name}: {small:.4f} s -> {large:.4f} s for 16x"


@pytest.mark.parametrize("name", GROWING_HTML)
def test_html_parsing_grows_linearly(name):
    small, large = (cpu_seconds(parse_html, GROWING_HTML[name](n)) for n in (16_000, 256_000))
    assert large <= 40 * max(small, 1e-3), f"{name}: {small:.4f} s -> {large:.4f} s for 16x"


AWKWARD = {       # a document, and the text runs a browser shows (character references read)
    '<!--[if IE]><p>eins</p><![endif]--><![if !IE]><p>zwei</p><![endif]>': ["zwei"],
    '<![CDATA[x < y]]>drei<?php echo "x"; ?>': ["drei"],
    '<p class=a data-x=\'1 &amp; 2\' hidden>vier &auml; &#228; &#xE4;<br/>fünf</p>':
        ["vier ä ä ä", "fünf"],
    '<ul><li>sechs<li>sieben</ul><p>acht': ["sechs", "sieben", "acht"],
    '<script>if (a < b && c) { d("</p>"); }</script><style>p > b { x: "<" }</style>neun': ["neun"],
    '<textarea><b>zehn</b></textarea><pre>elf\n  zwölf</pre><code>&lt;x&gt;</code>dreizehn':
        ["dreizehn"],
    '<!DOCTYPE html>\n<HTML LANG="de"><Body onload="x()">vierzehn</BODY></HTML>': ["vierzehn"],
    'a < b, AT&T &notanentity; fünfzehn': ["a < b, AT&T ¬anentity; fünfzehn"],
}


@pytest.mark.parametrize("markup", AWKWARD)
def test_html_comes_back_byte_for_byte_outside_its_text(markup):
    document = parse_html(markup)
    assert document.texts == AWKWARD[markup]
    marked = document.rebuild([f"[{index}]" for index in range(len(document.texts))])
    outside = markup
    for start, end in reversed(document.spans):
        outside = outside[:start] + "\0" + outside[end:]
    assert re.split(r"\[\d+\]", marked) == outside.split("\0")
    assert [html.unescape(markup[start:end]) for start, end in document.spans] == document.texts


def test_raw_text_and_unknown_markup_are_never_translated():
    documents_ = list(AWKWARD)
    document = parse_html(documents_[0] + documents_[4] + documents_[5])
    assert document.texts == ["zwei", "neun", "dreizehn"]


def post(port: int, body: dict, headers: dict | None = None) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/translate",
                                     json.dumps(body).encode(), {"Content-Type": "application/json",
                                                                 **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


def slow_body(port: int) -> socket.socket:
    """A connection that declares a large body and sends one byte of it."""
    connection = socket.create_connection(("127.0.0.1", port))
    connection.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                       b"\r\nContent-Length: 100000\r\n\r\n{")
    return connection


def test_the_client_address_cannot_be_forged_and_slow_bodies_are_dropped(tiny_runs):
    port = free_port()
    server = start_server(sys.executable, tiny_runs["transformer"], port, "--client-rate", "2",
                          "--body-timeout", "2", "--max-connections", "3")
    try:
        forged = [post(port, {"text": "sieben"}, {"X-Forwarded-For": f"10.0.0.{number}"})
                  for number in range(4)]
        assert forged == [200, 200, 429, 429]                 # one client, whatever it says
        slow = [slow_body(port) for _ in range(3)]
        time.sleep(0.5)
        busy = urllib.request.Request(f"http://127.0.0.1:{port}/detect", b"{}")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(busy, timeout=10)
        assert refused.value.code == 503 and refused.value.headers["Retry-After"] == "1"
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).status == 200
        started = time.monotonic()
        for connection in slow:
            connection.settimeout(10)
            answer = b""
            while chunk := connection.recv(4096):             # answered, then closed
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 408") and b"body_timeout 2 s" in answer
        assert time.monotonic() - started < 4
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_proxy_headers_are_read_from_the_named_proxies_only(tiny_runs):
    port = free_port()
    server = start_server(sys.executable, tiny_runs["transformer"], port, "--client-rate", "2",
                          "--forwarded-allow-ips", "127.0.0.1")
    try:
        forwarded = [post(port, {"text": "sieben"}, {"X-Forwarded-For": f"10.0.0.{number % 2}"})
                     for number in range(5)]
        assert forwarded == [200, 200, 200, 200, 429]          # two clients behind one proxy
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_one_clients_heavy_requests_do_not_hold_the_worker_from_the_others():
    # The batcher served requests in arrival order: five queued heavy requests (beam-10
    # traces of seconds each) held the one worker while every other client waited behind.
    import asyncio
    import concurrent.futures
    import types

    from attnmt.serve import MicroBatcher, Options

    def translate(texts, beam, *args, **kwargs):
        time.sleep(0.3 if beam == 10 else 0.01)
        return [f"beam {beam}"] * len(texts)

    batcher = MicroBatcher(types.SimpleNamespace(translate=translate),
                           concurrent.futures.ThreadPoolExecutor(1), wait_ms=1, max_texts=32)
    light = Options(1, 1, None, False)
    finished = []

    async def client(name, requests, at_once):
        async def one(number):                   # heavy requests differ: each decoded alone
            options = light if name == "light" else Options(10, 1, number / 10, False)
            await batcher.translate(["x"], options, name)
            finished.append((name, number))
        if at_once:
            await asyncio.gather(*(one(number) for number in range(requests)))
        else:
            for number in range(requests):
                await one(number)

    async def both():
        heavy_client = asyncio.create_task(client("heavy", 5, at_once=True))
        await asyncio.sleep(0.05)                                  # its requests queue first
        await client("light", 10, at_once=False)
        await heavy_client

    asyncio.run(both())
    second_heavy = finished.index(("heavy", 1))
    assert [name for name, _ in finished[:second_heavy]].count("light") == 10, finished
    assert batcher.charged["heavy"] >= 1.5 > 0.5 > batcher.charged["light"]


def test_an_address_refused_again_at_once_waits_for_its_answer(tiny_runs, monkeypatch):
    # Refusals sent in a loop cost the server as much as answers (about 350 a second held
    # the normal clients to a third of their throughput): the second of two refusals in a
    # row from one address is answered after the delay, at no cost to the server.
    import asyncio

    from attnmt.serve import Limits

    slept = []
    original_sleep = asyncio.sleep

    async def recorded_sleep(seconds, *args):
        slept.append(seconds)
        return await original_sleep(min(seconds, 0.01), *args)

    monkeypatch.setattr("attnmt.serve.asyncio.sleep", recorded_sleep)
    app = create_app(Translator.from_run(tiny_runs["transformer"]), Limits(refusal_delay=2.0))
    with TestClient(app) as client:
        bad = {"text": "sieben", "beam": 0}
        assert [client.post("/translate", json=bad).status_code for _ in range(3)] == [422] * 3
        assert slept == [2.0, 2.0]                          # the first at once, then held
        assert client.post("/translate", json={"text": "sieben"}).status_code == 200
        assert slept == [2.0, 2.0]                          # answers are never held
        detect = client.post("/detect", json={"q": 5})
        assert detect.status_code == 400 and slept == [2.0, 2.0, 2.0]
