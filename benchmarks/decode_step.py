"""Time of one Transformer ``decode_step`` at target positions 1, 64 and 256.

    python benchmarks/decode_step.py [--batch 32] [--vocab 8000] [--threads 2]

Batch 32, d_model 256, 3+3 layers, 4 heads, FFN 1024, source length 32, 2 threads.
With the self-attention cache, the cost of a step grows only with the attention
over cached keys, so the step at position 256 should stay within 2x of position 1.
Also prints the step time without the cache (re-running the whole prefix), for scale.
"""

from __future__ import annotations

import argparse
import time

import torch

from attnmt.config import ModelConfig
from attnmt.masks import padding_mask, target_mask
from attnmt.model import build_model


def time_call(function, repeats: int) -> float:
    function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = ModelConfig(arch="transformer", d_model=256, heads=4, ffn_dim=1024,
                         encoder_layers=3, decoder_layers=3, dropout=0.0, attention_dropout=0.0)
    model = build_model(config, args.vocab, args.vocab).eval()
    src = torch.randint(4, args.vocab, (args.batch, 32))
    tokens = torch.randint(4, args.vocab, (args.batch, 257))
    print(f"batch {args.batch}, d_model 256, 3+3 layers, vocab {args.vocab}, "
          f"{args.threads} threads; median over {args.repeats} decodings of 256 steps\n")
    positions = (1, 64, 256)
    with torch.inference_mode():
        memory = model.encode(src, padding_mask(src, 0))
        step_times = {position: [] for position in positions}
        for _ in range(args.repeats):
            state = None
            for position in range(1, 257):
                start = time.perf_counter()
                _, state, _ = model.decode_step(tokens[:, position - 1], state, memory,
                                                need_attention=False)
                if position in step_times:
                    step_times[position].append(time.perf_counter() - start)
        print("| position | cached step ms | uncached step ms (whole prefix again) |")
        print("|---|---|---|")
        for position in positions:
            prefix = tokens[:, :position]
            uncached = time_call(lambda: model(src, padding_mask(src, 0), prefix,
                                               target_mask(prefix, 0)), 5)
            print(f"| {position} | {median(step_times[position]) * 1e3:.2f} | {uncached * 1e3:.2f} |")
    ratio = median(step_times[256]) / median(step_times[1])
    print(f"\nposition 256 / position 1 (cached): {ratio:.2f}x")


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


if __name__ == "__main__":
    main()
