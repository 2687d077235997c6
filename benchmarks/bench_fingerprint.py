"""The exact model fingerprint: its cost on the default model, against sha256 over the same bytes.

``zones.core.models.model_fingerprint`` hashes every byte of every parameter and buffer (xxh3-128
per tensor, then sha256 over names, shapes, dtypes and those digests). Prints the median
wall time of ``--repeats`` calls (target: well under a second for SmolLM2-135M), the bytes
hashed and the rate, and the same for one sha256 over all the bytes, the cryptographic
alternative it was chosen over.

    .venv/bin/python benchmarks/bench_fingerprint.py [--model smollm2-135m] [--repeats 5]
"""
from __future__ import annotations

import argparse
import hashlib
import statistics
import time

import torch

from zones.core.models import load_model, model_fingerprint


def tensor_bytes(model: torch.nn.Module) -> list:
    """The raw bytes of every parameter and buffer, as uint8 arrays (no copies on CPU)."""
    tensors = [t for _, t in model.named_parameters()] + [t for _, t in model.named_buffers()]
    return [t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy() for t in tensors if t.numel()]


def sha256_all(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for raw in tensor_bytes(model):
        digest.update(raw)
    return digest.hexdigest()


def median_seconds(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    model = load_model(args.model, device="cpu", load_tokenizer=False).model
    n_bytes = sum(raw.nbytes for raw in tensor_bytes(model))
    print(f"{args.model}: {n_bytes / 1e6:.0f} MB of parameters and buffers")
    for name, function in (("model_fingerprint (xxh3-128 + sha256)", lambda: model_fingerprint(model)),
                           ("sha256 over all bytes", lambda: sha256_all(model))):
        seconds = median_seconds(function, args.repeats)
        print(f"  {name:40s} {seconds:6.3f} s  ({n_bytes / seconds / 1e9:.1f} GB/s)")


if __name__ == "__main__":
    main()
