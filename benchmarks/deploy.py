"""The translator without PyTorch: size, cold start, a test set end to end, and the server.

    python benchmarks/deploy.py EXPORT --python DEPLOY_PYTHON [--data DIR] [--requests 1000]
        [--clients 100] [--repeats 5]

EXPORT is a folder made by ``attnmt export`` (int8), DEPLOY_PYTHON the interpreter of an
environment made with the README's deployment command (``pip install ./deploy``, no
PyTorch). Everything timed runs in that environment; only the load generator runs here.
Prints:

* the environment's size on disk;
* one sentence, cold: ``echo SENTENCE | attnmt translate EXPORT``, wall time and peak
  memory of the process (median and worst of ``--repeats``);
* test_2016_flickr, beam 5: ``attnmt translate`` end to end, against the engine's own
  decoding of the same token ids (``translate_batch``, the threads attnmt gives it), and
  the BLEU of the output;
* ``attnmt serve EXPORT``: ``--requests`` requests of one short test sentence each (the
  quarter with the fewest words) from ``--clients`` concurrent clients, beam 5: failures,
  requests/s, latency, and the server's resident memory after them; then, where Debian's
  ``wrk`` is installed, the same requests for ``--seconds`` from a load generator written in
  C (the Python one above spends much of the 2 cores itself).

Run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import free_port, load, wait_until_up  # noqa: E402

SENTENCE = {"de": "Ein Hund rennt durch den Schnee.", "en": "A dog runs through the snow.",
            "fr": "Un chien court dans la neige.", "cs": "Pes běží sněhem."}

ENGINE_ONLY = """
import json, os, sys, time
from pathlib import Path
import ctranslate2
from attnmt.config import load_config
from attnmt.data.tokenizers import load_tokenizers
folder, source = Path(sys.argv[1]), sys.argv[2]
tokenizer, _ = load_tokenizers(folder)
pieces = [tokenizer.pieces(line) for line in open(source, encoding="utf-8").read().splitlines()]
cores = len(os.sched_getaffinity(0))
engine = ctranslate2.Translator(str(folder), compute_type="int8", inter_threads=cores, intra_threads=1)
config = load_config(folder / "config.yaml").decode
best = None
for _ in range(2):
    start = time.perf_counter()
    engine.translate_batch(pieces, max_batch_size=64, beam_size=5, length_penalty=config.alpha,
                           max_decoding_length=int(max(map(len, pieces)) * config.max_len_a + config.max_len_b))
    seconds = time.perf_counter() - start
    best = seconds if best is None else min(best, seconds)
print(json.dumps({"seconds": best}))
"""


def peak_kb(command: list[str], stdin: bytes) -> tuple[float, int]:
    """Wall seconds and peak memory of a process, from the kernel's accounting of the child."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    process.stdin.write(stdin)
    process.stdin.close()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    if status:
        raise SystemExit(f"{' '.join(command)} failed")
    return seconds, usage.ru_maxrss


def environment_mb(python: str) -> float:
    prefix = subprocess.run([python, "-c", "import sys; print(sys.prefix)"], capture_output=True,
                            text=True, check=True).stdout.strip()
    size = subprocess.run(["du", "-sk", prefix], capture_output=True, text=True, check=True).stdout
    return int(size.split()[0]) / 1024


def resident_mb(pid: int) -> tuple[float, float]:
    """Resident memory now and at its peak (VmRSS, VmHWM) of a running process, in MB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return tuple(int(fields[key].split()[0]) / 1024 for key in ("VmRSS", "VmHWM"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export")
    parser.add_argument("--python", required=True, help="interpreter of the deployment environment")
    parser.add_argument("--data", default=os.environ.get("ATTNMT_DATA", ""))
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=20, help="length of the wrk run")
    parser.add_argument("--workers", type=int, default=0,
                        help="the server's --workers (default 0: one per engine thread)")
    args = parser.parse_args()
    import yaml
    from sacrebleu.metrics import BLEU

    data = yaml.safe_load((Path(args.export) / "config.yaml").read_text())["data"]
    source_path = Path(args.data) / f"test_2016_flickr.{data['src_lang']}.gz"
    reference_path = Path(args.data) / f"test_2016_flickr.{data['tgt_lang']}.gz"
    import gzip

    sources = gzip.open(source_path, "rt", encoding="utf-8").read().splitlines()
    references = gzip.open(reference_path, "rt", encoding="utf-8").read().splitlines()
    attnmt = [args.python, "-m", "attnmt"]
    print(f"deployment environment: {environment_mb(args.python):.0f} MB")

    sentence = (SENTENCE.get(data["src_lang"], sources[0]) + "\n").encode()
    runs = [peak_kb([*attnmt, "translate", args.export], sentence) for _ in range(args.repeats)]
    walls, peaks = [wall for wall, _ in runs], [peak / 1024 for _, peak in runs]
    print(f"one sentence, cold: {statistics.median(walls):.3f} s median, {max(walls):.3f} s worst; "
          f"{statistics.median(peaks):.0f} MB median peak, {max(peaks):.0f} MB worst")

    with tempfile.TemporaryDirectory() as folder:
        plain = Path(folder) / "test.src"
        plain.write_text("".join(line + "\n" for line in sources), encoding="utf-8")
        output = Path(folder) / "hyp"
        ends = []
        for _ in range(2):
            start = time.perf_counter()
            subprocess.run([*attnmt, "translate", args.export, "-i", str(plain), "-o", str(output),
                            "--beam", "5"], check=True)
            ends.append(time.perf_counter() - start)
        engine = json.loads(subprocess.run([args.python, "-c", ENGINE_ONLY, args.export, str(plain)],
                                           capture_output=True, text=True, check=True).stdout)
        hypotheses = output.read_text(encoding="utf-8").splitlines()
    bleu = BLEU().corpus_score(hypotheses, [references]).score
    print(f"test_2016_flickr beam 5: {min(ends):.2f} s end to end (best of 2), the engine alone "
          f"{engine['seconds']:.2f} s: +{min(ends) - engine['seconds']:.2f} s; BLEU {bleu:.2f}")

    short = sorted(sources, key=lambda text: len(text.split()))[:len(sources) // 4]
    port = free_port()
    server = subprocess.Popen([*attnmt, "serve", args.export, "--port", str(port), "--max-texts", "64",
                               "--workers", str(args.workers)], stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url, server)
        result = asyncio.run(load(url, short, args.requests, args.clients, 5))
        now, peak = resident_mb(server.pid)
        print(f"serve: {args.requests} requests from {args.clients} clients, beam 5, short "
              f"sentences: {result['failed']} failed, {result['answered'] / result['seconds']:.1f} "
              f"requests/s, p50 {result['p50']:.3f} s, p99 {result['p99']:.3f} s; resident "
              f"{now:.0f} MB (peak {peak:.0f} MB)", flush=True)
        if shutil.which("wrk"):
            print(wrk_load(url, short, args.clients, args.seconds))
            now, peak = resident_mb(server.pid)
            print(f"resident after it: {now:.0f} MB (peak {peak:.0f} MB)")
    finally:
        server.terminate()
        server.wait(timeout=30)


def wrk_load(url: str, texts: list[str], clients: int, seconds: int) -> str:
    """Requests/s and latency of ``wrk`` posting the texts in turn (beam 5) for ``seconds``."""
    bodies = ", ".join(f"[==[{json.dumps({'text': text, 'beam': 5})}]==]" for text in texts)
    script = ("local bodies = {" + bodies + "}\nlocal count = 0\n"
              "request = function()\n  count = count + 1\n"
              "  return wrk.format('POST', '/translate', {['Content-Type'] = 'application/json'}, "
              "bodies[count % #bodies + 1])\nend\n")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as handle:
        handle.write(script)
    output = subprocess.run(["wrk", "-t1", f"-c{clients}", f"-d{seconds}s", "--latency",
                             "-s", handle.name, url], capture_output=True, text=True, check=True).stdout
    os.unlink(handle.name)
    lines = {line.split(":")[0].strip(): line for line in output.splitlines()}
    errors = [line.strip() for line in output.splitlines() if "Non-2xx" in line or "Socket errors" in line]
    latency = [line.split() for line in output.splitlines() if line.strip().startswith(("50%", "99%"))]
    return (f"serve, wrk ({clients} connections, {seconds} s): {lines['Requests/sec'].split()[-1]} "
            f"requests/s, p50 {latency[0][1]}, p99 {latency[1][1]}"
            f"{'; ' + '; '.join(errors) if errors else ', no errors'}")


if __name__ == "__main__":
    main()
