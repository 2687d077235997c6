"""Building the offline tasks' data from the held-out (eval) split of the book's corpora.

Two four-way multiple-choice tasks, each example a context and four continuations of which
one is the text that really follows:

* ``zones_next_sentence`` (corpus ``stdlib``, docstring prose): the context is up to three
  consecutive sentences of a paragraph, the answer the paragraph's next sentence, the three
  distractors sentences of other paragraphs of similar length (in words).
* ``zones_next_line`` (corpus ``stdlib-code``, the standard library's source): the context is
  the six lines before a line of code, the answer that line, the distractors lines from
  elsewhere in the code of similar length, given the answer's indentation (so indentation
  tells nothing).

Held out means: inside the ``eval`` split of ``zones.core.data`` as the book cuts it (the
default model's tokenizer, windows of ``seq_len`` = 256 tokens, every fourth window
calibration). A paragraph (or a line with its context) is used only when its characters lie
wholly inside eval windows, so no example shares a character with the calibration windows on
which the pruning strategies plan and the healing trains (for the default model's tokenizer;
another tokenizer cuts other windows). Distractors come from held-out text too.

Everything is deterministic: the corpora are deterministic for a Python version, the choices
come from ``random.Random(SEED)``, and the files are written with sorted keys and ``\\n``
line ends, so :func:`build` on the same Python and tokenizer writes the same bytes; the
manifest records both, and ``tests/test_tasks.py`` rebuilds and compares.

    python -m zones.measure.tasks.build            # rewrite zones/measure/tasks/offline/*.jsonl
"""
from __future__ import annotations

import argparse
import bisect
import hashlib
import json
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from zones.core.data import CALIBRATION_EVERY, Corpus, load_corpus, tokenizer_fingerprint
from zones.core.glossary import default

OFFLINE_DIR = Path(__file__).resolve().parent / "offline"
MANIFEST = "manifest.json"
SEED = default("seed")
SEQ_LEN = default("seq_len")          # the book's window length: the split the examples are held out of
N_EXAMPLES = 500       # per task; a run takes the first --limit of them
N_CHOICES = 4
BUILD_VERSION = "1"

# Sentences of prose: 5-40 words, cut after . ! ? before a capital letter.
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
SENTENCE_WORDS = (5, 40)
CONTEXT_SENTENCES = 3
# Lines of code: 12-80 characters once stripped, with six lines of context before them.
LINE_CHARS = (12, 80)
CONTEXT_LINES = 6


@dataclass(frozen=True)
class TaskSpec:
    """One offline task: its lm-eval name, the corpus it is cut from, its data file and builder."""

    name: str
    corpus: str
    data_file: str
    units: Callable[[str, "HeldOut"], tuple[list[dict], list[dict]]]
    what: str


class HeldOut:
    """Which characters of a corpus lie inside eval windows (``zones.core.data``'s split)."""

    def __init__(self, text: str, tokenizer, seq_len: int = SEQ_LEN):
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        offsets = enc["offset_mapping"]
        n_windows = len(offsets) // seq_len
        # Calibration windows (and the tail after the last whole window) are forbidden spans.
        spans = []
        for w in range(n_windows):
            if w % CALIBRATION_EVERY == CALIBRATION_EVERY - 1:
                spans.append((offsets[w * seq_len][0], offsets[(w + 1) * seq_len - 1][1]))
        tail = offsets[n_windows * seq_len][0] if n_windows * seq_len < len(offsets) else len(text)
        spans.append((tail, len(text) + 1))
        self.starts = [a for a, _ in spans]
        self.ends = [b for _, b in spans]
        self.n_tokens = len(offsets)

    def inside(self, start: int, end: int) -> bool:
        """True when the characters ``[start, end)`` touch no calibration window (nor the tail)."""
        i = bisect.bisect_right(self.starts, end - 1) - 1  # the last forbidden span starting before ``end``
        return i < 0 or self.ends[i] <= start


def _words(text: str) -> str:
    return " ".join(text.split())


def prose_units(text: str, held: HeldOut) -> tuple[list[dict], list[dict]]:
    """(examples without distractors, distractor pool) from held-out paragraphs of prose."""
    examples, pool = [], []
    position = 0
    for paragraph_index, paragraph in enumerate(text.split("\n\n")):
        start, position = position, position + len(paragraph) + 2
        if not held.inside(start, start + len(paragraph)):
            continue
        lines = paragraph.strip().splitlines()
        if any(line.lstrip().startswith(("-", "*", ":", "|", "+")) for line in lines):
            continue  # lists, field lists and tables are not running prose
        sentences = [_words(s) for s in SENTENCE_END.split(paragraph.strip())]
        ok = [SENTENCE_WORDS[0] <= len(s.split()) <= SENTENCE_WORDS[1] and s[-1] in ".!?" for s in sentences]
        for i, s in enumerate(sentences):
            if ok[i]:
                pool.append(dict(text=s, group=paragraph_index, size=len(s.split())))
        for j in range(1, len(sentences)):
            context = sentences[max(0, j - CONTEXT_SENTENCES):j]
            if ok[j] and all(ok[max(0, j - CONTEXT_SENTENCES):j]):
                examples.append(dict(context=" ".join(context), answer=sentences[j], group=paragraph_index,
                                     size=len(sentences[j].split())))
    return examples, pool


def _code_line(line: str) -> bool:
    stripped = line.strip()
    return (LINE_CHARS[0] <= len(stripped) <= LINE_CHARS[1] and not stripped.startswith(("#", '"', "'"))
            and any(c.isalpha() for c in stripped))


def _inside_strings(lines: Sequence[str]) -> list[bool]:
    """For each line: does it start inside a triple-quoted string, or hold a triple quote? (A
    parity count of triple quotes: docstrings and long strings are text, not lines of code.)"""
    flags, open_quote = [], None
    for line in lines:
        marks = re.findall(r'"""|\'\'\'', line)
        flags.append(open_quote is not None or bool(marks))
        for mark in marks:
            if open_quote is None:
                open_quote = mark
            elif mark == open_quote:
                open_quote = None
    return flags


def code_units(text: str, held: HeldOut) -> tuple[list[dict], list[dict]]:
    """(examples without distractors, distractor pool) from held-out lines of code."""
    lines = text.split("\n")
    starts = np.cumsum([0] + [len(line) + 1 for line in lines])
    in_string = _inside_strings(lines)
    examples, pool = [], []
    for i, line in enumerate(lines):
        if in_string[i] or not _code_line(line) or "\t" in line:
            continue
        if held.inside(int(starts[i]), int(starts[i]) + len(line)):
            pool.append(dict(text=line.strip(), group=i // 200, size=len(line.strip())))
        if i < CONTEXT_LINES:
            continue
        context = lines[i - CONTEXT_LINES:i]
        if sum(bool(c.strip()) for c in context) < 3 or not context[-1].strip():
            continue
        if not held.inside(int(starts[i - CONTEXT_LINES]), int(starts[i]) + len(line)):
            continue
        examples.append(dict(context="\n".join(context), answer=line.strip(), indent=line[:len(line) - len(line.lstrip())],
                             group=i // 200, size=len(line.strip())))
    return examples, pool


def _distractors(example: dict, by_size: list[dict], sizes: list[int], rng: random.Random, unit: str) -> list[str]:
    """Three texts of other groups whose size is within 25% (at least 2 words or 8 characters)
    of the answer's, drawn without replacement; none equal to the answer or to each other."""
    slack = max(2 if unit == "words" else 8, round(0.25 * example["size"]))
    lo = bisect.bisect_left(sizes, example["size"] - slack)
    hi = bisect.bisect_right(sizes, example["size"] + slack)
    candidates = list(range(lo, hi))
    rng.shuffle(candidates)
    chosen: list[str] = []
    for c in candidates:
        item = by_size[c]
        if item["group"] != example["group"] and item["text"] != example["answer"] and item["text"] not in chosen:
            chosen.append(item["text"])
            if len(chosen) == N_CHOICES - 1:
                return chosen
    return []


def make_examples(examples: list[dict], pool: list[dict], n: int, seed: int, unit: str) -> list[dict]:
    """``n`` examples drawn at random (``seed``) from ``examples``, each with its answer and three
    distractors shuffled into ``choices`` and the answer's index in ``label``."""
    rng = random.Random(seed)
    order = list(range(len(examples)))
    rng.shuffle(order)
    by_size = sorted(pool, key=lambda p: (p["size"], p["text"], p["group"]))
    sizes = [p["size"] for p in by_size]
    rows, seen = [], set()
    for i in order:
        example = examples[i]
        if (example["context"], example["answer"]) in seen:
            continue
        distractors = _distractors(example, by_size, sizes, rng, unit)
        if not distractors:
            continue
        indent = example.get("indent", "")
        choices = [indent + example["answer"]] + [indent + d for d in distractors]
        perm = list(range(N_CHOICES))
        rng.shuffle(perm)
        rows.append(dict(id=len(rows), context=example["context"], choices=[choices[p] for p in perm],
                         label=perm.index(0)))
        seen.add((example["context"], example["answer"]))
        if len(rows) == n:
            break
    return rows


TASKS = {
    "zones_next_sentence": TaskSpec("zones_next_sentence", "stdlib", "next_sentence.jsonl", prose_units,
                                    "the true next sentence of a docstring paragraph among four"),
    "zones_next_line": TaskSpec("zones_next_line", "stdlib-code", "next_line.jsonl", code_units,
                                "the true next line of standard-library code among four"),
}


def jsonl_bytes(examples: Sequence[dict]) -> bytes:
    """The data file's bytes: one JSON object (example) a line, keys sorted, UTF-8, ``\\n`` line ends."""
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in examples).encode("utf-8")


def build_task(spec: TaskSpec, tokenizer, corpus: Corpus | None = None, *, n: int = N_EXAMPLES,
               seed: int = SEED, seq_len: int = SEQ_LEN) -> tuple[bytes, dict]:
    """The data file of one task (bytes) and its manifest entry."""
    corpus = corpus or load_corpus(spec.corpus)
    held = HeldOut(corpus.text, tokenizer, seq_len)
    examples, pool = spec.units(corpus.text, held)
    rows = make_examples(examples, pool, n, seed, "words" if spec.corpus == "stdlib" else "chars")
    if len(rows) < n:
        raise ValueError(f"{spec.name}: only {len(rows)} of {n} examples could be built from the held-out "
                         f"text of {spec.corpus}")
    data = jsonl_bytes(rows)
    entry = dict(file=spec.data_file, sha256=hashlib.sha256(data).hexdigest(), n_examples=len(rows),
                 corpus=spec.corpus, corpus_fingerprint=corpus.fingerprint, what=spec.what,
                 candidates=len(examples), pool=len(pool))
    return data, entry


def build(tokenizer, *, tasks: Sequence[str] = tuple(TASKS), n: int = N_EXAMPLES, seed: int = SEED,
          seq_len: int = SEQ_LEN, tokenizer_name: str = "smollm2-135m") -> dict[str, bytes]:
    """Every task's data file and the manifest, as ``{file name: bytes}`` (nothing written)."""
    files, entries = {}, {}
    for name in tasks:
        data, entry = build_task(TASKS[name], tokenizer, n=n, seed=seed, seq_len=seq_len)
        files[entry["file"]] = data
        entries[name] = entry
    manifest = dict(build_version=BUILD_VERSION, python=".".join(map(str, sys.version_info[:3])), seed=seed,
                    seq_len=seq_len, calibration_every=CALIBRATION_EVERY, tokenizer=tokenizer_name,
                    tokenizer_fingerprint=tokenizer_fingerprint(tokenizer), tasks=entries)
    files[MANIFEST] = (json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")
    return files


def main(argv: list[str] | None = None) -> int:
    from zones.core.atomic import atomic_write_bytes
    from zones.core.models import DEFAULT_MODEL, load_model

    parser = argparse.ArgumentParser(prog="python -m zones.measure.tasks.build", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(OFFLINE_DIR), help="folder for the data files (default: the package's)")
    args = parser.parse_args(argv)
    tokenizer = load_model(DEFAULT_MODEL, device="cpu").tokenizer
    for name, data in build(tokenizer, tokenizer_name=DEFAULT_MODEL).items():
        atomic_write_bytes(Path(args.out) / name, data)
        print(f"wrote {Path(args.out) / name} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
