"""The operating characteristics of the scorecard's rules, as Methods prints them.

For each rule, simulated data sets of the book's sizes (``zones.analysis.power``) with a known
truth: the share of them the rule calls "holds", "does not hold" and "inconclusive". A rule
that can say "holds" only 10% of the time when the paper's effect is true is a rule whose
"inconclusive" says little; Methods prints these shares so that a reader can weigh each verdict.

``python -m zones.report.operating`` prints the table as Markdown (``book/methods/verdicts.md``
holds that output; ``tests/test_operating.py`` checks that the page and the code agree).
"""
from __future__ import annotations


import pandas as pd

from zones.analysis.power import N_DRAWS as POWER_DRAWS
from zones.analysis.power import exponent_draws, mean_draws, operating, rho_draws
from zones.analysis.unit_intervals import interval_side
from zones.report.verdicts import (
    PAPER_EXPONENT,
    PAPER_RHO,
    PAPER_RHO_MID,
    rho_rule,
    rho_strict_rule,
    score_exponent_interval,
    score_partial_rho,
    side_verdict,
)

COLUMNS = ["rule", "truth", "size", "holds", "does not hold", "inconclusive"]
BLOCKS = (8, 12, 16, 30)        # the trained runs' depths and SmolLM2's
WINDOWS = (8, 12, 64)           # the pruning and healing chapters' eval windows (cpu), the ablation's, the gpu budget
N_DRAWS = POWER_DRAWS             # per cell (the scorecard quotes the same cells)
RUNS = ({8: 2, 12: 1, 16: 1}, {8: 2, 12: 2, 16: 2}, {8: 3, 12: 3, 16: 3})   # the cpu series, then more seeds
RUN_SD = (0.05, 0.15)   # run-to-run sd of log Δα: the cpu build's two D8 runs differ by 0.08 (sd ≈ 0.05)


def _above_zero(estimate: float, low: float, high: float, n: int) -> str:  # noqa: ARG001
    """Every "interval against 0" rule (direction, healing, the shape's rank trend, ρ beyond depth)."""
    return str(side_verdict(interval_side(low, high, 0.0), "above"))


def _partial(rho: float, low: float, high: float, p: float, n: int) -> str:  # noqa: ARG001
    return str(score_partial_rho(low, high, n_blocks=n))


def _exponent(estimate: float, low: float, high: float, n: int) -> str:  # noqa: ARG001
    return str(score_exponent_interval(low, high))


def operating_table(n_draws: int = N_DRAWS, seed: int = 0) -> pd.DataFrame:
    """One row per (rule, truth, size): the shares of :data:`COLUMNS`, rounded to 2 decimals."""
    rows = []

    def add(rule_name: str, truth: str, size: str, shares: dict) -> None:
        rows.append(dict(rule=rule_name, truth=truth, size=size, **{k: round(v, 2) for k, v in shares.items()}))

    rho_cells = ((0.84, "ρ = 0.84 (the paper's top)"), (PAPER_RHO_MID, f"ρ = {PAPER_RHO_MID} (the band's middle)"),
                 (PAPER_RHO[0], f"ρ = {PAPER_RHO[0]} (the band's bottom)"), (0.5, "ρ = 0.5 (below the band)"),
                 (0.0, "ρ = 0 (no effect)"))
    for name, rule in ((f"ρ claim, as the paper reads it (point ρ ≥ {PAPER_RHO[0]}, p < 0.02)", rho_rule),
                       (f"ρ claim, strict (whole interval ≥ {PAPER_RHO[0]}, p < 0.02)", rho_strict_rule)):
        for rho, truth in rho_cells:
            for n in BLOCKS:
                add(name, truth, f"{n} blocks", operating(rule, rho_draws(rho, n, n_draws=n_draws, seed=seed)))
    for rho, truth in ((0.5, "ρ = 0.5"), (0.0, "ρ = 0 (no effect)")):
        for n in BLOCKS:
            add("ρ beyond depth, rank trend of the α profile (interval above 0; simulated as a plain rank "
                "correlation)", truth, f"{n} blocks",
                operating(_partial, rho_draws(rho, n, n_draws=n_draws, seed=seed)))
    for effect, truth in ((1.0, "mean = 1 sd of a window's difference"), (0.5, "mean = 0.5 sd"),
                          (0.0, "mean = 0 (no effect)")):
        for n in WINDOWS:
            add("paired difference above 0 (direction, after healing)", truth, f"{n} windows",
                operating(_above_zero, mean_draws(effect, 1.0, n, n_draws=n_draws, seed=seed)))
    for b, truth in ((PAPER_EXPONENT, f"b = {PAPER_EXPONENT} (the paper's)"), (0.0, "b = 0 (no scaling)")):
        for sd in RUN_SD:
            for runs in RUNS:
                size = f"{' + '.join(str(n) for n in runs.values())} runs at depths " \
                       f"{', '.join(map(str, runs))}; run-to-run sd {sd}"
                add("Δα exponent (t interval over runs contains b = 0.26 and lies above 0)", truth, size,
                    operating(_exponent, exponent_draws(b, sd, runs, n_draws=n_draws, seed=seed)))
    return pd.DataFrame(rows, columns=COLUMNS)


def operating_markdown(table: pd.DataFrame) -> str:
    """The table as Markdown, one row per cell."""
    head = "| " + " | ".join(COLUMNS) + " |\n| " + " | ".join("---" for _ in COLUMNS) + " |\n"
    return head + "".join("| " + " | ".join(f"{v:.2f}" if isinstance(v, float) else str(v) for v in r) + " |\n"
                          for r in table.itertuples(index=False))


SECTION = """## How often each rule is right

Every verdict of the scorecard comes from a stated rule (`zones.report.verdicts`). How much a
verdict says depends on how often its rule gives each word by chance, so each rule is run on
data sets simulated at the book's sizes with a known truth (`zones.analysis.power`, {n} data sets
per row, seeded; a share's standard error is at most 0.035): the share of them it calls *holds*,
*does not hold* and *inconclusive*. Where the truth is the paper's effect, *holds* is the rule's
power; where there is no effect, *holds* is its false alarm. The ρ rules rank simulated blocks;
the paired-difference rule, eval windows; the Δα exponent, training runs whose log Δα scatters
about a power law by the stated run-to-run sd. The task-accuracy rule's power is exact, not
simulated (Zero-shot tasks, above). Regenerate the table with `python -m zones.report.operating`.

"""


def operating_section(table: pd.DataFrame, n_draws: int = N_DRAWS) -> str:
    """The Methods section: a heading, what the table shows, and the table."""
    return SECTION.format(n=n_draws) + operating_markdown(table)


__all__ = ["BLOCKS", "COLUMNS", "WINDOWS", "operating_markdown", "operating_section", "operating_table"]

if __name__ == "__main__":
    print(operating_section(operating_table()), end="")
