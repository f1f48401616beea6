"""Time and peak extra memory of the three scaled dot-product attention paths.

    python benchmarks/attention.py [--lengths 256 1024 4096 16384] [--chunk 1024]

B=1, H=4, d_head=64, fp32, 2 threads, no mask (self-attention over T positions).
Each measurement runs in a fresh subprocess so that peak RSS belongs to that path
alone: "extra memory" is the peak resident set minus the resident set after q, k, v
were allocated. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

from child import measure_in_child, print_measurement

PATHS = ("plain", "chunked", "torch")


def measure(path: str, length: int, chunk: int, repeats: int) -> dict:
    import torch

    from attnmt.attention import scaled_dot_product_attention

    torch.set_num_threads(2)
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, length, 64, generator=generator) for _ in range(3))
    options = {"plain": {}, "chunked": {"chunk_size": chunk}, "torch": {"need_weights": False}}[path]
    baseline_kib = _current_rss_kib()
    times = []
    with torch.inference_mode():
        for _ in range(repeats):
            start = time.perf_counter()
            out, _ = scaled_dot_product_attention(q, k, v, **options)
            times.append(time.perf_counter() - start)
            del out
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": min(times), "extra_mib": max(0, peak_kib - baseline_kib) / 1024}


def _current_rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096, 16384])
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one", nargs=2, metavar=("PATH", "T"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print_measurement(measure, args.one[0], int(args.one[1]), args.chunk, args.repeats)
        return
    print(f"B=1 H=4 d_head=64 fp32, 2 threads, chunk {args.chunk}; min of {args.repeats} runs\n")
    print("| T | plain s | plain extra MiB | chunked s | chunked extra MiB | torch s | torch extra MiB |"
          " chunked / torch |")
    print("|---|---|---|---|---|---|---|---|")
    for length in args.lengths:
        row = {}
        for path in PATHS:
            row[path] = measure_in_child([sys.executable, __file__, "--one", path, str(length),
                                          "--chunk", str(args.chunk), "--repeats", str(args.repeats)])
        cells = " | ".join(f"{row[p]['seconds']:.4f} | {row[p]['extra_mib']:.0f}" for p in PATHS)
        ratio = row["chunked"]["seconds"] / row["torch"]["seconds"]
        print(f"| {length} | {cells} | {ratio:.2f} |", flush=True)


if __name__ == "__main__":
    main()
