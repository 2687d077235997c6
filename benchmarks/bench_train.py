"""Training throughput against this CPU's fp32 matmul peak, measured side by side in one run.

For each configuration: tokens/s of full optimizer steps (forward, backward, clip, AdamW) and
the achieved GFLOP/s from ``zones.series.flops_per_token`` (6·N + 12·depth·width·seq_len),
next to the fp32 GFLOP/s of a 2048² matmul timed before and after (the peak on this machine,
under its current load). Also compares fused and foreach AdamW. Prints the CPU capability.

``--overhead`` also times a reference forward (``zones.book.timing.reference_forward_seconds``) and gives
each step's overhead as the book reads it: step seconds / (the work the training loop counts for
it, ``zones.core.progress.count_training``, × the reference forward's seconds). ``--ops N`` adds
the N operators that take most of a step (``torch.profiler``, self CPU time per step): where the
time the count does not see goes (attention at head size 16, copies, GELU, log-softmax).

    .venv/bin/python benchmarks/bench_train.py [--steps 8] [--threads 2] [--depths 8,12,16]
    .venv/bin/python benchmarks/bench_train.py --overhead --ops 8
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 .venv/bin/python benchmarks/bench_train.py
"""
from __future__ import annotations

import argparse
import time

import torch

from zones.core.hardware import cpu_capability, native_bf16
from zones.series.loop import _autocast
from zones.series import build_model, flops_per_token, make_optimizer, parameter_count, profile_config

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def _value(text: str):
    """A --set value: an int, a float, or the text itself (precision=bf16)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def matmul_gflops(n: int = 2048, repeats: int = 5, clock: str = "wall") -> float:
    """fp32 GFLOP/s of an n×n matmul: the best of ``repeats`` (wall or process CPU seconds)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = CLOCKS[clock]()
        a @ b
        best = min(best, CLOCKS[clock]() - start)
    return 2 * n ** 3 / best / 1e9


def train_step(model, optimizer, batch, precision: str = "fp32") -> None:
    """One optimizer step as the training loop takes it: forward (bf16 autocast for ``precision``
    ``"bf16"``, as ``zones.series.loop``), backward, clip, AdamW."""
    with _autocast(torch.device("cpu"), precision):
        loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def step_seconds(config, steps: int, fused: bool, clock: str = "wall") -> float:
    model = build_model(config)
    model.train()
    optimizer = make_optimizer(model, config) if fused else torch.optim.AdamW(model.parameters(), lr=config.lr,
                                                                              foreach=True)
    batch = torch.randint(0, config.vocab_size, (config.batch_size, config.seq_len))
    times = []
    for i in range(steps + 2):
        start = CLOCKS[clock]()
        train_step(model, optimizer, batch, config.precision)
        if i >= 2:  # the first two steps allocate
            times.append(CLOCKS[clock]() - start)
    return min(times)  # the least disturbed step: other processes share these cores


def counted_seconds(config, reference: float) -> float:
    """Seconds the book expects of one step: the work the loop counts for it (forward, backward,
    AdamW; ``zones.core.progress``) × a reference forward's seconds."""
    from zones.core import progress

    model = build_model(config)
    before = progress.work_done()
    progress.count_training(model, config.tokens_per_step)
    return (progress.work_done() - before) * reference


def top_operators(config, count: int, steps: int = 5) -> list[tuple[str, float]]:
    """The ``count`` operators with the most self CPU time per step (ms), over ``steps`` steps."""
    from torch.profiler import profile

    model = build_model(config).train()
    optimizer = make_optimizer(model, config)
    batch = torch.randint(0, config.vocab_size, (config.batch_size, config.seq_len))
    for _ in range(2):
        train_step(model, optimizer, batch)
    with profile() as prof:
        for _ in range(steps):
            train_step(model, optimizer, batch)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:count]
    return [(e.key, e.self_cpu_time_total / 1e3 / steps) for e in events]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--depths", default="8,12,16")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall seconds, or process CPU seconds (with --threads 1: robust to a loaded machine)")
    parser.add_argument("--foreach", action="store_true", help="also time foreach (unfused) AdamW")
    parser.add_argument("--overhead", action="store_true",
                        help="time a reference forward and give each step's overhead as the book reads it")
    parser.add_argument("--ops", type=int, default=0, metavar="N", help="the N costliest operators of a step")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = {k: _value(v) for k, v in (s.split("=", 1) for s in args.set)}
    print(f"CPU capability {cpu_capability()}, native bf16: {native_bf16('cpu')}, torch threads "
          f"{torch.get_num_threads()}, torch {torch.__version__}")
    before = matmul_gflops(clock=args.clock)
    print(f"fp32 matmul 2048² ({args.clock} clock, best of 5): {before:.1f} GFLOP/s")
    rows = []
    for depth in [int(d) for d in args.depths.split(",")]:
        config = profile_config(args.profile, depth, **overrides)
        for fused in (True, False) if args.foreach else (True,):
            seconds = step_seconds(config, args.steps, fused, args.clock)
            tokens = config.tokens_per_step / seconds
            rows.append((depth, config.hidden_size, parameter_count(config), fused, tokens,
                         tokens * flops_per_token(config) / 1e9, seconds))
    after = matmul_gflops(clock=args.clock)
    peak = (before + after) / 2
    print(f"fp32 matmul 2048² after: {after:.1f} GFLOP/s; peak used below: {peak:.1f}")
    reference = None
    if args.overhead:
        from zones.book.timing import reference_forward_seconds

        reference = reference_forward_seconds()
        print(f"a reference forward (SmolLM2-135M, float32, 2,048 tokens): {reference:.2f} s")
    extra = f" {'ms/step':>8} {'counted':>8} {'overhead':>8}" if reference else ""
    print(f"{'depth':>5} {'width':>5} {'params':>8} {'AdamW':>8} {'tokens/s':>9} {'GFLOP/s':>8} {'of peak':>7}{extra}")
    for depth, width, params, fused, tokens, gflops, seconds in rows:
        line = (f"{depth:>5} {width:>5} {params / 1e6:>7.2f}M {'fused' if fused else 'foreach':>8} {tokens:>9.0f} "
                f"{gflops:>8.1f} {100 * gflops / peak:>6.1f}%")
        if reference:
            counted = counted_seconds(profile_config(args.profile, depth, **overrides), reference)
            line += f" {1e3 * seconds:>8.1f} {1e3 * counted:>8.1f} {seconds / counted:>7.2f}×"
        print(line)
    for depth in [int(d) for d in args.depths.split(",")] if args.ops else []:
        config = profile_config(args.profile, depth, **overrides)
        ops = ", ".join(f"{name} {ms:.1f}" for name, ms in top_operators(config, args.ops))
        print(f"depth {depth}, ms per step by operator (self CPU): {ops}")


if __name__ == "__main__":
    main()
