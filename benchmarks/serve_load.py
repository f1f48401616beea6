"""Load test of `attnmt serve`: N requests from C concurrent clients on loopback.

    python benchmarks/serve_load.py RUN [--requests 1000] [--clients 50] [--beam 5]
        [--engines torch ctranslate2] [--micro-batching on off] [--abuse 10]

Starts the server once per engine (PyTorch, or CTranslate2 int8 exported into the run
first) and micro-batching mode, in a subprocess; sends one sentence of Multi30k
test_2016_flickr per request (cycling), and prints the number of failed or lost
requests, throughput and p50/p99 latency. With ``--abuse K``, K more clients send the
heaviest requests the limits let through or must refuse (:data:`ABUSIVE`) for as long
as the load runs, while the server's resident memory and the time ``/health`` takes
to answer are sampled every 100 ms; it prints their maxima and the abusive answers
by status.
"""

from __future__ import annotations

import argparse
import asyncio
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
                response = await session.post(f"{url}/translate", json=ABUSIVE[index % len(ABUSIVE)])
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

    async def client(session: httpx2.AsyncClient):
        nonlocal failures
        while not queue.empty():
            index = queue.get_nowait()
            text = texts[index % len(texts)]
            start = time.perf_counter()
            try:
                response = await session.post(f"{url}/translate", json={"text": text, "beam": beam})
                ok = response.status_code == 200 and \
                    response.json()["translations"][0]["source"] == text
            except httpx2.HTTPError:
                ok = False
            latencies.append(time.perf_counter() - start)
            failures += not ok

    limits = httpx2.Limits(max_connections=clients)
    async with httpx2.AsyncClient(timeout=300, limits=limits) as session:
        start = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(clients)))
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
    parser.add_argument("--data", default=os.environ.get("ATTNMT_DATA", ""),
                        help="folder of the Multi30k files (default: $ATTNMT_DATA)")
    return parser.parse_args()


def benchmark(args: argparse.Namespace) -> None:
    """Serve ``args.run`` with each engine and micro-batching mode in turn; print a row each."""
    from attnmt.config import load_config
    from attnmt.data.corpus import find_language_file, read_lines

    config = load_config(Path(args.run) / "config.yaml")
    texts = read_lines(find_language_file(Path(args.data) / "test_2016_flickr", config.data.src_lang))
    print(f"{args.requests} requests, {args.clients} concurrent clients, beam {args.beam}, "
          f"{args.threads} threads, loopback, {args.abuse} abusive clients\n")
    print("| engine | micro-batching | answered | failed | seconds | requests/s | p50 s | p99 s | "
          "server RSS max MB | /health max s | abusive answers |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for engine, mode in ((engine, mode) for engine in args.engines for mode in args.micro_batching):
        if engine == "ctranslate2":           # export before the clock: not part of serving
            from attnmt.translator import Translator

            Translator.from_run(args.run, engine="ctranslate2")
        port = free_port()
        command = [sys.executable, "-m", "attnmt", "serve", args.run, "--port", str(port),
                   "--threads", str(args.threads), "--max-texts", "64", "--engine", engine]
        if mode == "off":
            command.append("--no-micro-batch")
        with tempfile.TemporaryFile() as server_log:
            server = subprocess.Popen(command, stderr=server_log)
            try:
                url = f"http://127.0.0.1:{port}"
                wait_until_up(url, server, server_log)
                result = asyncio.run(load_with_abuse(url, server.pid, texts, args.requests,
                                                     args.clients, args.beam, args.abuse))
            finally:
                server.terminate()
                server.wait(timeout=30)
        abusive = ", ".join(f"{status}: {count}" for status, count in sorted(result["abusive"].items()))
        print(f"| {engine} | {mode} | {result['answered']} | {result['failed']} | "
              f"{result['seconds']:.1f} | {result['answered'] / result['seconds']:.1f} | "
              f"{result['p50']:.2f} | {result['p99']:.2f} | {result['rss_max_mb']:.0f} | "
              f"{result['health_max_s']:.2f} | {abusive or '-'} |", flush=True)


if __name__ == "__main__":
    main()
