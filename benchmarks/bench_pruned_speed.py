"""Speed of pruned models: tokens per second of exported pruned models against the full one.

Each pruned model is written by ``zones.pruning.export.export_model`` (the directory a user gets from
``zones export``) and loaded back with plain ``transformers.AutoModelForCausalLM``, so what is
timed is what a user runs. Two workloads: a forward pass over ``--batch`` × ``--seq-len``
tokens (scoring, prefill), and greedy generation of ``--new-tokens`` tokens with the KV cache
(decoding). The models are timed in rounds, interleaved (full, pruned k1, pruned k2, ..., then
again), so that load on a shared machine biases them alike; each row reports the median over
rounds and the speed-up over the full model measured in the same rounds. Expect a speed-up
close to n_blocks / (n_blocks − k) on the blocks' share of the time (the embedding and the LM
head do not shrink).

    .venv/bin/python benchmarks/bench_pruned_speed.py [--model smollm2-135m] [--k 4,8]
        [--strategy last_n_keep_last] [--rounds 3] [--seq-len 128] [--batch 4] [--new-tokens 32]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
from transformers import AutoModelForCausalLM

from zones.core.models import load_model
from zones.pruning.export import choose_removed, export_model


def timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--k", default="4,8", help="numbers of blocks removed, comma-separated")
    parser.add_argument("--strategy", default="last_n_keep_last", help="strategy that picks the blocks")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    loaded = load_model(args.model, device="cpu")
    ks = [int(k) for k in args.k.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        models = {"full (k = 0)": (0, loaded.model)}
        loaded.model.config.use_cache = True
        for k in ks:
            removed = choose_removed(loaded.model, args.strategy, k, progress=False)
            out = export_model(loaded.model, removed, Path(tmp) / f"k{k}", tokenizer=loaded.tokenizer,
                               source=args.model, strategy=args.strategy)
            models[f"{args.strategy} k = {k}"] = (k, AutoModelForCausalLM.from_pretrained(out).eval())
        torch.manual_seed(0)
        vocab = loaded.model.get_input_embeddings().num_embeddings
        ids = torch.randint(0, vocab, (args.batch, args.seq_len))
        prompt = ids[:1, :16]
        times = {name: dict(forward=[], generate=[]) for name in models}
        with torch.inference_mode():
            for name, (_, model) in models.items():  # warm-up
                model(input_ids=ids[:1, :8], use_cache=False)
            for _ in range(args.rounds):
                for name, (_, model) in models.items():
                    times[name]["forward"].append(timed(lambda: model(input_ids=ids, use_cache=False)))
                    times[name]["generate"].append(timed(lambda: model.generate(
                        prompt, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                        use_cache=True, pad_token_id=0)))
    full = times["full (k = 0)"]
    rows = []
    for name, (k, model) in models.items():
        t = times[name]
        speed_forward = [args.batch * args.seq_len / s for s in t["forward"]]
        speed_generate = [args.new_tokens / s for s in t["generate"]]
        rows.append(dict(model=name, blocks=model.config.num_hidden_layers,
                         forward_tok_s=statistics.median(speed_forward),
                         forward_speedup=statistics.median(f / s for f, s in zip(full["forward"], t["forward"])),
                         generate_tok_s=statistics.median(speed_generate),
                         generate_speedup=statistics.median(f / s for f, s in zip(full["generate"], t["generate"]))))
    print(f"{args.model}: forward over {args.batch}×{args.seq_len} tokens, greedy generation of "
          f"{args.new_tokens} tokens (KV cache); median of {args.rounds} interleaved rounds, "
          f"{torch.get_num_threads()} threads")
    print(pd.DataFrame(rows).round(2).to_string(index=False))


if __name__ == "__main__":
    main()
