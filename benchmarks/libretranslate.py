"""LibreTranslate's API on ``attnmt serve``: its cost against attnmt's own API, a long
paragraph in one request, and LibreTranslate itself serving the same model.

    python benchmarks/libretranslate.py EXPORT --python DEPLOY_PYTHON [--data DIR]
        [--clients 100] [--seconds 20] [--beam 5] [--libretranslate LT_PYTHON]

EXPORT is a folder made by ``attnmt export`` (int8), DEPLOY_PYTHON the interpreter of the
deployment install (``pip install ./deploy``). Prints, with ``wrk`` (Debian's load generator,
written in C) cycling through the quarter of test_2016_flickr's sources with the fewest
words for ``--seconds`` from ``--clients`` connections, at beam ``--beam``:

* ``attnmt serve EXPORT``, attnmt's requests (``{"text": ..., "beam": B}``) and
  LibreTranslate's (``{"q": ..., "source": ..., "target": ...}``, the server's beam capped at
  B by ``--max-beam``), alternated ``--rounds`` times: requests/s, p50 and p99 of each run,
  and the ratio of the medians;
* one request of a paragraph of test sentences of at least 2,000 characters: status,
  sentences, seconds;
* with ``--libretranslate LT_PYTHON`` (an environment with ``pip install libretranslate``):
  LibreTranslate serving the same int8 model as an Argos package (``metadata.json``, the
  CTranslate2 model under ``model/``, ``sentencepiece.model``) with ``ARGOS_BEAM_SIZE=B``.
  Its sentence splitter (MiniSBD) downloads a model at run time; offline it is replaced by
  one that returns the text as one sentence, which is what it would find in these
  one-sentence requests, and costs nothing.

Run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import free_port, wait_until_up  # noqa: E402

NAMES = {"cs": "Czech", "de": "German", "en": "English", "fr": "French"}

# LibreTranslate with its run-time-downloaded sentence splitter replaced (see above).
LIBRETRANSLATE = """
import sys
from argostranslate import sbd
sbd.MiniSBDSentencizer.split_sentences = lambda self, text: [text]
from libretranslate.main import main
sys.argv = ["libretranslate"] + sys.argv[1:]
main()
"""


def wrk(url: str, bodies: list[str], content_type: str, clients: int, seconds: int) -> dict:
    """``wrk`` posting ``bodies`` in turn to ``/translate``: requests/s, p50, p99, errors."""
    quoted = ", ".join(f"[==[{body}]==]" for body in bodies)
    script = ("local bodies = {" + quoted + "}\nlocal count = 0\n"
              "request = function()\n  count = count + 1\n"
              f"  return wrk.format('POST', '/translate', {{['Content-Type'] = '{content_type}'}}, "
              "bodies[count % #bodies + 1])\nend\n")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as handle:
        handle.write(script)
    output = subprocess.run(["wrk", "-t1", f"-c{clients}", f"-d{seconds}s", "--latency",
                             "--timeout", "30s", "-s", handle.name, url],
                            capture_output=True, text=True, check=True).stdout
    os.unlink(handle.name)
    lines = {line.split(":")[0].strip(): line for line in output.splitlines()}
    latency = {line.split()[0]: line.split()[1] for line in output.splitlines()
               if line.strip().startswith(("50%", "99%"))}
    errors = [line.strip() for line in output.splitlines()
              if "Non-2xx" in line or "Socket errors" in line]
    return {"requests_per_s": float(lines["Requests/sec"].split()[-1]), "p50": latency["50%"],
            "p99": latency["99%"], "errors": "; ".join(errors) or "none"}


def describe(name: str, result: dict) -> str:
    return (f"{name}: {result['requests_per_s']:.1f} requests/s, p50 {result['p50']}, "
            f"p99 {result['p99']}, errors: {result['errors']}")


def post(url: str, body: dict) -> tuple[int, dict, float]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            status, answer = response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        status, answer = error.code, json.loads(error.read())
    return status, answer, time.perf_counter() - start


def argos_package(export: Path, folder: Path, src: str, tgt: str) -> None:
    """The export as an Argos package in ``folder``."""
    (folder / "model").mkdir(parents=True)
    for path in [export / "model.bin", export / "config.json", *export.glob("*vocabulary*")]:
        shutil.copy(path, folder / "model" / path.name)
    models = sorted(export.glob("spm*.model"))
    shutil.copy(models[0], folder / "sentencepiece.model")
    (folder / "metadata.json").write_text(json.dumps({
        "package_version": "1.0", "argos_version": "1.9", "from_code": src, "to_code": tgt,
        "from_name": NAMES.get(src, src), "to_name": NAMES.get(tgt, tgt), "type": "translate"}))


def serve_libretranslate(python: str, export: Path, src: str, tgt: str, beam: int,
                         folder: Path, port: int) -> subprocess.Popen:
    argos_package(export, folder / "packages" / f"{src}_{tgt}", src, tgt)
    environment = {**os.environ, "ARGOS_PACKAGES_DIR": str(folder / "packages"),
                   "ARGOS_BEAM_SIZE": str(beam), "ARGOS_DEVICE_TYPE": "cpu",
                   "XDG_DATA_HOME": str(folder / "data"), "XDG_CACHE_HOME": str(folder / "cache"),
                   "XDG_CONFIG_HOME": str(folder / "config"), "HOME": str(folder)}
    return subprocess.Popen([python, "-c", LIBRETRANSLATE, "--host", "127.0.0.1", "--port",
                             str(port), "--disable-web-ui", "--load-only", f"{src},{tgt}"],
                            env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export")
    parser.add_argument("--python", required=True, help="interpreter of the deployment install")
    parser.add_argument("--libretranslate", metavar="LT_PYTHON",
                        help="interpreter of an environment with libretranslate installed")
    parser.add_argument("--data", default=os.environ.get("ATTNMT_DATA", ""))
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3,
                        help="wrk runs of each API on attnmt serve, alternated")
    args = parser.parse_args()
    export = Path(args.export)
    data = yaml.safe_load((export / "config.yaml").read_text())["data"]
    src, tgt = data["src_lang"], data["tgt_lang"]
    sources = gzip.open(Path(args.data) / f"test_2016_flickr.{src}.gz", "rt",
                        encoding="utf-8").read().splitlines()
    short = sorted(sources, key=lambda text: len(text.split()))[:len(sources) // 4]
    native = [json.dumps({"text": text, "beam": args.beam}, ensure_ascii=False) for text in short]
    libre = [json.dumps({"q": text, "source": src, "target": tgt}, ensure_ascii=False)
             for text in short]
    paragraph = ""
    for sentence in sources:
        if len(paragraph) >= 2000:
            break
        paragraph += sentence.rstrip(".") + ". "
    print(f"{len(short)} short test_2016_flickr sentences, {args.clients} connections, "
          f"{args.seconds} s each, beam {args.beam}", flush=True)

    port = free_port()
    server = subprocess.Popen([args.python, "-m", "attnmt", "serve", str(export), "--port",
                               str(port), "--max-beam", str(args.beam), "--max-texts", "64"],
                              stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, server)
        post(f"{url}/translate", {"text": short[0]})                       # warm up
        own, theirs = [], []
        for _ in range(args.rounds):                    # alternated: the machine drifts
            own.append(wrk(url, native, "application/json", args.clients, args.seconds))
            print(describe("attnmt serve, attnmt's API", own[-1]), flush=True)
            theirs.append(wrk(url, libre, "application/json", args.clients, args.seconds))
            print(describe("attnmt serve, LibreTranslate's API", theirs[-1]), flush=True)
        medians = [statistics.median(r["requests_per_s"] for r in results)
                   for results in (own, theirs)]
        print(f"medians of {args.rounds}: attnmt's API {medians[0]:.1f} requests/s, "
              f"LibreTranslate's {medians[1]:.1f}: ratio {medians[1] / medians[0]:.3f}")
        status, answer, seconds = post(f"{url}/translate", {"q": paragraph.strip(),
                                                             "source": src, "target": tgt})
        print(f"a paragraph of {len(paragraph.strip())} characters "
              f"({paragraph.count('. ')} sentences): status {status}, {seconds:.2f} s, "
              f"{len(answer.get('translatedText', ''))} characters back"
              + ("" if status == 200 else f": {answer}"), flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)

    if args.libretranslate:
        with tempfile.TemporaryDirectory() as folder:
            port = free_port()
            server = serve_libretranslate(args.libretranslate, export, src, tgt, args.beam,
                                          Path(folder), port)
            url = f"http://127.0.0.1:{port}"
            try:
                deadline = time.time() + 300
                while True:
                    try:
                        urllib.request.urlopen(f"{url}/languages", timeout=2)
                        break
                    except OSError:
                        if time.time() > deadline or server.poll() is not None:
                            raise SystemExit("LibreTranslate did not start")
                        time.sleep(1)
                status, answer, _ = post(f"{url}/translate", {"q": short[0], "source": src,
                                                              "target": tgt})
                print(f"LibreTranslate answers {status}: {short[0]!r} -> {answer}", flush=True)
                result = wrk(url, libre, "application/json", args.clients, args.seconds)
                print(describe("LibreTranslate, the same model", result))
            finally:
                server.terminate()
                server.wait(timeout=30)


if __name__ == "__main__":
    main()
