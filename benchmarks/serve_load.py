"""Load test of `attnmt serve`: N requests from C concurrent clients on loopback.

    python benchmarks/serve_load.py RUN [--requests 1000] [--clients 50] [--beam 5]
        [--engines torch ctranslate2] [--micro-batching on off] [--abuse 10]
    python benchmarks/serve_load.py RUN --attacks [--engines ...]

Starts the server once per engine (PyTorch, or CTranslate2 int8 exported into the run
first) and micro-batching mode, in a subprocess; sends one sentence of Multi30k
test_2016_flickr per request (cycling), and prints the number of failed or lost
requests, throughput and p50/p99 latency. With ``--abuse K``, K more clients send the
heaviest requests the limits let through or must refuse (:data:`ABUSIVE`) for as long
as the load runs, while the server's resident memory and the time ``/health`` takes
to answer are sampled every 100 ms; it prints their maxima and the abusive answers
by status. Each client sends an API key of its own, so the server tells them apart (as
it would clients at different addresses).

With ``--attacks``, it sends instead each malformed or pathological request of
:func:`attack_requests` (bodies up to 1 MiB) alone and prints its answer and the server's
CPU seconds for it; then 10 clients send them in a loop for 20 s while ``/health`` and the
resident memory are sampled; then 1,000 connections declare a body and send one byte of
it, and it prints how long ``/health`` and a translation take meanwhile and when the last
of them was closed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2

from attnmt.errors import UserError


# Requests within every per-field limit that cost the most: attention, self-attention,
# n-best and search steps over a long source and an output that alpha keeps long, and a
# temperature that overflowed every score.
ABUSIVE = [
    {"text": "x. " * 130, "beam": 10, "n_best": 10, "alpha": 10, "attention": True,
     "self_attention": True},
    {"text": "x. " * 40, "beam": 10, "n_best": 10, "alpha": 10, "attention": True,
     "self_attention": True},
    {"text": "x. " * 40, "beam": 10, "n_best": 1, "alpha": 10, "attention": True,
     "self_attention": True},
    {"text": "x. " * 40, "beam": 10, "n_best": 10, "alpha": 10, "trace": True},
    {"text": "x. " * 130, "n_best": 10, "sample": {"temperature": 1e-300}},
    {"texts": ["x. " * 30] * 32, "beam": 1, "attention": True},
]


def attack_requests() -> list[tuple[str, str, bytes, dict]]:
    """``(name, path, body, headers)`` of the requests that once cost a server error or
    minutes of CPU: malformed bodies, keys that are not strings, pathological texts and
    HTML, each as large as the body limit (1 MiB) allows, and the texts also as large as the
    response budget lets through to parsing and splitting (480,000 characters)."""
    mib = (1 << 20) - 200
    json_type = {"Content-Type": "application/json"}

    def libre(q, **fields) -> bytes:
        return json.dumps({"q": q, "source": "de", "target": "en", **fields}).encode()

    within = 480_000
    passing = [
        ("full stops without spaces, 480 K", libre("aaaaa." * (within // 6) + "x B")),
        ("nested tags, 480 K", libre("<b>x" * (within // 4), format="html")),
        ("unclosed tags, 480 K", libre("<a" * (within // 2), format="html")),
        ("nested tags under the tag bound, 480 K",
         libre("<b>" + "x" * 40 + "<i>y" * 9000 + "z" * (within - 36_100), format="html")),
        ("unclosed attribute, 480 K", libre('<p title="' + "<a " * (within // 3), format="html")),
        ("many sentences, 480 K", libre("Ein Hund rennt. " * (within // 16))),
        ("one word per line, 480 K", libre("zwei\n" * (within // 5))),
    ]
    return [(name, "/translate", body, json_type) for name, body in passing] + [
        ("nested JSON, /translate", "/translate", b"[" * mib, json_type),
        ("nested JSON, /detect", "/detect", b"[" * mib, json_type),
        ("a 5,000-digit beam", "/translate", b'{"text": "x", "beam": ' + b"9" * 5000 + b"}",
         json_type),
        ("api_key a list, /detect", "/detect", b'{"q": "Hallo", "api_key": ["a"]}', json_type),
        ("api_key an object", "/translate", libre("Hallo", api_key={"a": 1}), json_type),
        ("multipart without a boundary", "/translate", b"x",
         {"Content-Type": "multipart/form-data"}),
        ("HTML the parser rejects", "/translate", libre("<p>Hallo</p><![x<![" * 1000,
                                                          format="html"), json_type),
        ("full stops without spaces", "/translate", libre("aaaaa." * (mib // 6) + "x B"),
         json_type),
        ("nested tags", "/translate", libre("<b>x" * (mib // 4), format="html"), json_type),
        ("unclosed tags", "/translate", libre("<a" * (mib // 2), format="html"), json_type),
        ("a script ending elsewhere", "/translate",
         libre("<script><!--<script></script>var x = 1;</script><p>drei</p>" * 10000,
               format="html"), json_type),
        ("one attribute, alternatives 9", "/translate",
         libre('<p title="' + "a" * (mib - 100) + '">drei</p>', format="html", alternatives=9),
         json_type),
        ("many sentences", "/translate", libre("Ein Hund rennt. " * (mib // 16)), json_type),
    ]


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def attacks(url: str, pid: int) -> None:
    """Each attack alone (answer, server CPU), then all in a loop from 10 clients, then
    1,000 slow bodies; printed as tables."""
    requests = attack_requests()
    print("| request | body bytes | answer | server CPU s |\n|---|---|---|---|")
    async with httpx2.AsyncClient(timeout=600) as session:
        for name, path, body, headers in requests:
            before = cpu_seconds(pid)
            response = await session.post(url + path, content=body, headers=headers)
            print(f"| {name} | {len(body):,} | {response.status_code} "
                  f"{response.text[:60]!r} | {cpu_seconds(pid) - before:.2f} |", flush=True)
    stop, statuses = asyncio.Event(), {}

    async def client(session, first: int):
        index = first
        while not stop.is_set():
            name, path, body, headers = requests[index % len(requests)]
            try:
                status = (await session.post(url + path, content=body, headers=headers)).status_code
            except httpx2.HTTPError:
                status = 0
            statuses[status] = statuses.get(status, 0) + 1
            index += 1

    watcher = asyncio.create_task(watch(url, pid, stop))
    async with httpx2.AsyncClient(timeout=600, limits=httpx2.Limits(max_connections=10)) as session:
        senders = [asyncio.create_task(client(session, number)) for number in range(10)]
        await asyncio.sleep(20)
        stop.set()
        await asyncio.gather(*senders)
    watched = await watcher
    print(f"\n10 clients, 20 s: answers {dict(sorted(statuses.items()))}; /health slowest "
          f"{watched['health_max_s']:.2f} s of {watched['health_samples']} samples; server "
          f"resident memory at most {watched['rss_max_mb']:.0f} MB", flush=True)
    await slow_bodies(url, 1000)


async def slow_bodies(url: str, count: int) -> None:
    """``count`` connections that declare a 1,000,000-byte body and send one byte; how
    /health and a translation answer meanwhile, and when the last connection is closed."""
    host, port = url.removeprefix("http://").split(":")
    started = time.perf_counter()
    connections = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000000\r\n\r\n{")
        connections.append((reader, writer))
    opened = time.perf_counter() - started
    async with httpx2.AsyncClient(timeout=60) as session:
        start = time.perf_counter()
        health = (await session.get(f"{url}/health")).status_code
        health_seconds = time.perf_counter() - start
        start = time.perf_counter()
        answer = await session.post(f"{url}/translate", json={"text": "Ein Hund rennt."})
        translate_seconds = time.perf_counter() - start

    async def closed(reader) -> tuple[float, bytes]:
        said = await reader.read()             # until the server closes the connection
        return time.perf_counter() - started, said[9:12]

    ends = await asyncio.gather(*(closed(reader) for reader, _ in connections))
    for reader, writer in connections:
        writer.close()
    statuses = {}
    for _, status in ends:
        statuses[status.decode()] = statuses.get(status.decode(), 0) + 1
    print(f"\n{count} slow bodies opened in {opened:.1f} s; meanwhile /health {health} in "
          f"{health_seconds:.2f} s, a translation {answer.status_code} in {translate_seconds:.2f} s "
          f"({answer.text[:50]!r}); answered {dict(sorted(statuses.items()))}, every connection "
          f"closed by the server within {max(end for end, _ in ends):.1f} s of the first "
          "opening", flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def abuse(url: str, clients: int, stop: asyncio.Event) -> dict:
    """``clients`` clients cycling through :data:`ABUSIVE` until ``stop``; answers by status."""
    statuses: dict[int, int] = {}

    async def client(session: httpx2.AsyncClient, first: int):
        index = first
        while not stop.is_set():
            try:
                response = await session.post(f"{url}/translate", json={
                    **ABUSIVE[index % len(ABUSIVE)], "api_key": f"abusive-{first}"})
                status = response.status_code
            except httpx2.HTTPError:
                status = 0
            statuses[status] = statuses.get(status, 0) + 1
            index += 1

    async with httpx2.AsyncClient(timeout=300, limits=httpx2.Limits(max_connections=clients)) as session:
        await asyncio.gather(*(client(session, number) for number in range(clients)))
    return statuses


async def watch(url: str, pid: int, stop: asyncio.Event) -> dict:
    """The server's resident memory and /health's answer time, every 100 ms until ``stop``."""
    rss, health = [], []
    async with httpx2.AsyncClient(timeout=30) as session:
        while not stop.is_set():
            rss.append(resident_mb(pid))
            start = time.perf_counter()
            try:
                ok = (await session.get(f"{url}/health")).status_code == 200
            except httpx2.HTTPError:
                ok = False
            health.append(time.perf_counter() - start if ok else float("inf"))
            await asyncio.sleep(0.1)
    return {"rss_max_mb": max(rss), "health_max_s": max(health), "health_samples": len(health)}


def resident_mb(pid: int) -> float:
    """The resident memory of a process (Linux /proc), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc")


async def load_with_abuse(url: str, pid: int, texts: list[str], requests: int, clients: int,
                          beam: int, abusers: int) -> dict:
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch(url, pid, stop))
    abusive = asyncio.create_task(abuse(url, abusers, stop)) if abusers else None
    result = await load(url, texts, requests, clients, beam)
    stop.set()
    result.update(await watcher)
    result["abusive"] = await abusive if abusive else {}
    return result


async def load(url: str, texts: list[str], requests: int, clients: int, beam: int) -> dict:
    latencies, failures = [], 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(requests):
        queue.put_nowait(index)

    async def client(session: httpx2.AsyncClient, key: str):
        nonlocal failures
        while not queue.empty():
            index = queue.get_nowait()
            text = texts[index % len(texts)]
            start = time.perf_counter()
            try:
                response = await session.post(f"{url}/translate", json={"text": text, "beam": beam,
                                                                         "api_key": key})
                ok = response.status_code == 200 and \
                    response.json()["translations"][0]["source"] == text
            except httpx2.HTTPError:
                ok = False
            latencies.append(time.perf_counter() - start)
            failures += not ok

    limits = httpx2.Limits(max_connections=clients)
    async with httpx2.AsyncClient(timeout=300, limits=limits) as session:
        start = time.perf_counter()
        await asyncio.gather(*(client(session, f"normal-{number}") for number in range(clients)))
        seconds = time.perf_counter() - start
    latencies.sort()
    return {"answered": len(latencies), "failed": failures, "seconds": seconds,
            "p50": latencies[len(latencies) // 2], "p99": latencies[int(len(latencies) * 0.99) - 1]}


def wait_until_up(url: str, server: subprocess.Popen, server_log) -> None:
    """Return once /health answers; a server that exits or never answers is the user's
    problem (a damaged run, a missing engine), told with the last line it wrote."""
    deadline = time.time() + 120
    while time.time() < deadline:
        if server.poll() is not None:
            server_log.seek(0)
            said = server_log.read().decode(errors="replace").strip().splitlines()
            raise UserError(f"`attnmt serve` exited: {said[-1] if said else 'no message'}")
        try:
            httpx2.get(f"{url}/health", timeout=1)
            return
        except httpx2.HTTPError:
            time.sleep(0.2)
    raise UserError(f"`attnmt serve` did not answer {url}/health within 120 s")


def main() -> None:
    try:      # a run that is not one, no test set for its language, a server that cannot start
        benchmark(parse_arguments())
    except UserError as error:
        sys.exit(f"serve_load.py: {error}")


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--engines", nargs="+", default=["torch", "ctranslate2"])
    parser.add_argument("--micro-batching", nargs="+", default=["on"], choices=["on", "off"])
    parser.add_argument("--abuse", type=int, default=0, metavar="K",
                        help="K more clients sending the abusive requests meanwhile")
    parser.add_argument("--attacks", action="store_true",
                        help="send the malformed and pathological requests instead of the load")
    parser.add_argument("--data", default=os.environ.get("ATTNMT_DATA", ""),
                        help="folder of the Multi30k files (default: $ATTNMT_DATA)")
    return parser.parse_args()


@contextlib.contextmanager
def served(args: argparse.Namespace, engine: str, mode: str):
    """``attnmt serve RUN`` with ``engine`` and micro-batching ``mode`` in a subprocess:
    yields its URL and process id, once it answers."""
    if engine == "ctranslate2":               # export before the clock: not part of serving
        from attnmt.translator import Translator

        Translator.from_run(args.run, engine="ctranslate2")
    port = free_port()
    keys = Path(tempfile.mkdtemp()) / "keys.txt"            # one key a client: who is who
    keys.write_text("".join(f"normal-{number}\n" for number in range(args.clients)) +
                    "".join(f"abusive-{number}\n" for number in range(args.abuse)))
    command = [sys.executable, "-m", "attnmt", "serve", args.run, "--port", str(port),
               "--threads", str(args.threads), "--max-texts", "64", "--engine", engine]
    command += [] if args.attacks else ["--api-keys", str(keys)]
    if mode == "off":
        command.append("--no-micro-batch")
    with tempfile.TemporaryFile() as server_log:
        server = subprocess.Popen(command, stderr=server_log)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until_up(url, server, server_log)
            yield url, server.pid
        finally:
            server.terminate()
            server.wait(timeout=30)


def benchmark(args: argparse.Namespace) -> None:
    """Serve ``args.run`` with each engine and micro-batching mode in turn; print a row each."""
    from attnmt.config import load_config
    from attnmt.data.corpus import find_language_file, read_lines

    if args.attacks:
        for engine in args.engines:
            print(f"\n## {engine}\n")
            with served(args, engine, "on") as (url, pid):
                asyncio.run(attacks(url, pid))
        return
    config = load_config(Path(args.run) / "config.yaml")
    texts = read_lines(find_language_file(Path(args.data) / "test_2016_flickr", config.data.src_lang))
    print(f"{args.requests} requests, {args.clients} concurrent clients, beam {args.beam}, "
          f"{args.threads} threads, loopback, {args.abuse} abusive clients\n")
    print("| engine | micro-batching | answered | failed | seconds | requests/s | p50 s | p99 s | "
          "server RSS max MB | /health max s | abusive answers |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for engine, mode in ((engine, mode) for engine in args.engines for mode in args.micro_batching):
        with served(args, engine, mode) as (url, pid):
            result = asyncio.run(load_with_abuse(url, pid, texts, args.requests, args.clients,
                                                 args.beam, args.abuse))
        abusive = ", ".join(f"{status}: {count}" for status, count in sorted(result["abusive"].items()))
        print(f"| {engine} | {mode} | {result['answered']} | {result['failed']} | "
              f"{result['seconds']:.1f} | {result['answered'] / result['seconds']:.1f} | "
              f"{result['p50']:.2f} | {result['p99']:.2f} | {result['rss_max_mb']:.0f} | "
              f"{result['health_max_s']:.2f} | {abusive or '-'} |", flush=True)


if __name__ == "__main__":
    main()
