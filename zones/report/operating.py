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

from zones.analysis.power import DEPTH_ALPHA_NOISE, DEPTH_BLOCK_SD, DEPTH_NOISE
from zones.analysis.power import N_DRAWS as POWER_DRAWS
from zones.analysis.power import (
    WORDS,
    depth_draws,
    asymmetry_draws,
    crossover_draws,
    exponent_draws,
    first_block_draws,
    first_blocks_words,
    mean_draws,
    operating,
    ratio_draws,
    rho_draws,
    shape_draws,
    wave_draws,
)
from zones.analysis.unit_intervals import MAX_UNDEFINED, interval_side
from zones.report.verdicts import (
    ASYMMETRY_EFFECT,
    EXPONENT_RUN_SD,
    LAST_N_KEEP_LAST,
    OURS,
    PAPER_CROSSOVER_K,
    PAPER_EXPONENT,
    PAPER_GAP,
    PAPER_RATIO,
    PAPER_RHO,
    PAPER_RHO_MID,
    first_blocks,
    rho_rule,
    rho_strict_rule,
    score_asymmetry,
    score_crossover,
    score_exponent_interval,
    score_gap,
    PARTIAL_P,
    partial_rule,
    score_ratio_magnitude,
    score_shape,
    score_wave,
    side_verdict,
)

COLUMNS = ["rule", "truth", "size", "holds", "does not hold", "inconclusive", "false alarm"]
# The truths under which a rule's "holds" is a false alarm (no effect of the kind the rule claims). The raw ρ on
# the structured null is not among them: α and ΔLoss do share a depth trend there, which is all the raw ρ claims.
NULL_TRUTHS = ("ρ = 0 (no effect)", "mean = 0 (no effect)", "b = 0 (no scaling)", "ratio 1 (no effect)",
               "gap 1 (no effect)", "no difference at any k", "std ratio 1 (no asymmetry)", "all blocks alike",
               "no wave", "flat profile")
MAX_FALSE_ALARM = 0.05   # a rule that says "holds" more often than this where there is no effect is changed
BLOCKS = (8, 12, 16, 30)        # the trained runs' depths and SmolLM2's
WINDOWS = (8, 12, 64)           # the pruning and healing chapters' eval windows (cpu), the ablation's, the gpu budget
N_DRAWS = POWER_DRAWS             # per cell (the scorecard quotes the same cells)
RUNS = ({8: 2, 12: 1, 16: 1}, {8: 2, 12: 2, 16: 2}, {8: 3, 12: 3, 16: 3})   # earlier cpu series, 2 each, the cpu series
RUN_SD = (EXPONENT_RUN_SD, 0.15)   # run-to-run sd of log Δα: the cpu build's two D8 runs differ by 0.08 (sd ≈ 0.05)
WINDOW_LOG_SD, ARM_CORR = 0.5, 0.5   # a window's ΔPPL: log-sd (the cpu build's SmolLM2 windows vary by about half
                                     # their mean), and the correlation of the two arms' logs on one window
LAYERS = (8, 12, 16)            # the trained runs' layers (the wave's)
ABLATION_BLOCKS = (8, 16, 30)   # a trained run's, the deepest trained run's, SmolLM2's
ABLATION_WINDOWS = 12           # the ablation chapter's eval windows (cpu)
KS = tuple(range(1, 9))         # the pruning sweep's k (cpu)
LOOSE_ALPHA_NOISE = 3.0         # α's scatter about depth where α is only loosely ordered by depth (SmolLM2's)
SNAPSHOTS = 12                  # a cpu run's snapshots after step 0 (every 8 steps to 64, then every 48 to 240)


def _above_zero(estimate: float, low: float, high: float, n: int) -> str:  # noqa: ARG001
    """Every "interval against 0" rule (direction, healing, the shape's rank trend, ρ beyond depth)."""
    return str(side_verdict(interval_side(low, high, 0.0), "above"))


def _raw_rho(rho: float, low: float, high: float, p: float, n: int, undefined: float = 0.0) -> str:  # noqa: ARG001
    return rho_rule(rho, low, high, p, n)


def _exponent(estimate: float, low: float, high: float, n: int) -> str:  # noqa: ARG001
    return str(score_exponent_interval(low, high))


def _magnitude(estimate: float, low: float, high: float, n: int) -> str:  # noqa: ARG001
    return str(score_ratio_magnitude(low, high, ratio=estimate))


def _gap(estimate: float, low: float, high: float, n: int) -> str:  # noqa: ARG001
    return str(score_gap(low, high, gap=estimate))


def _crossover(sides, n: int) -> str:  # noqa: ARG001
    """``score_crossover`` of the winners per k that ``crossover_draws``' sides name (k = 1, 2, …)."""
    names = {1: OURS, -1: LAST_N_KEEP_LAST, 0: "tie"}
    return str(score_crossover({k + 1: names[int(s)] for k, s in enumerate(sides)}, OURS, LAST_N_KEEP_LAST))


def _asymmetry(estimate: float, low: float, high: float, n: int) -> str:  # noqa: ARG001
    return str(score_asymmetry(low, high, n_layers=n))


def _wave(leader: str, after_low: float, after_high: float, n: int) -> str:
    return str(score_wave(leader, after_low, after_high, n_layers=n))


def _shape(shape: str, n: int) -> str:
    return str(score_shape(shape, n_blocks=n))


def crossover_effects(kind: str, effect: float = 1.0, ks=KS, cross: int = PAPER_CROSSOVER_K) -> list[float]:
    """The true mean of d = Δloss(Last-N) − Δloss(zone-aware) at each k, in window sd: ``"crosses"``:
    a line through 0 halfway between k = ``cross`` − 1 and ``cross``, reaching ``effect`` at the largest k
    (Last-N ahead below ``cross``, zone-aware from it: the paper's); ``"ahead"``: ``effect`` at every
    k (zone-aware ahead throughout, no crossover); ``"none"``: 0 at every k."""
    ks = list(ks)
    if kind == "crosses":
        middle = cross - 0.5
        return [effect * (k - middle) / (ks[-1] - middle) for k in ks]
    if kind == "ahead":
        return [effect] * len(ks)
    if kind == "none":
        return [0.0] * len(ks)
    raise ValueError(f"kind must be 'crosses', 'ahead' or 'none'; got {kind!r}")


def operating_table(n_draws: int = N_DRAWS, seed: int = 0) -> pd.DataFrame:
    """One row per (rule, truth, size): the shares of :data:`COLUMNS`, rounded to 2 decimals."""
    rows = []

    def add(rule_name: str, truth: str, size: str, shares: dict, null: bool | None = None) -> None:
        null = truth in NULL_TRUTHS if null is None else null
        rows.append(dict(rule=rule_name, truth=truth, size=size, **{k: round(v, 2) for k, v in shares.items()},
                         **{"false alarm": "yes" if null else ""}))

    drawn: dict[tuple[float, int], dict] = {}

    def rho_at(rho: float, n: int) -> dict:
        """The cell's simulated ρ data sets, drawn once for every rule that reads them."""
        if (rho, n) not in drawn:
            drawn[(rho, n)] = rho_draws(rho, n, n_draws=n_draws, seed=seed)
        return drawn[(rho, n)]

    rho_cells = ((0.84, "ρ = 0.84 (the paper's top)"), (PAPER_RHO_MID, f"ρ = {PAPER_RHO_MID} (the band's middle)"),
                 (PAPER_RHO[0], f"ρ = {PAPER_RHO[0]} (the band's bottom)"), (0.5, "ρ = 0.5 (below the band)"),
                 (0.0, "ρ = 0 (no effect)"))
    for name, rule in ((f"ρ claim, as the paper reads it (point ρ ≥ {PAPER_RHO[0]}, p < 0.02)", rho_rule),
                       (f"ρ claim, strict (whole interval ≥ {PAPER_RHO[0]}, p < 0.02)", rho_strict_rule)):
        for rho, truth in rho_cells:
            for n in BLOCKS:
                add(name, truth, f"{n} blocks", operating(rule, rho_at(rho, n)))
    partial_name = (f"ρ beyond depth (partial ρ: interval over blocks and eval windows above 0, permutation p < "
                    f"{PARTIAL_P}, at most {MAX_UNDEFINED:.0%} of resamples undefined)")
    for partial, alpha_noise, truth in (
            (0.0, DEPTH_ALPHA_NOISE, "structured null: α and ΔLoss share only their depth trends, α nearly monotone"),
            (0.8, DEPTH_ALPHA_NOISE, "α's own deviation tied to ΔLoss's by 0.8, α nearly monotone"),
            (0.0, LOOSE_ALPHA_NOISE, "structured null, α loosely tied to depth"),
            (0.8, LOOSE_ALPHA_NOISE, "tied by 0.8, α loosely tied to depth")):
        for n in BLOCKS:
            draws = depth_draws(n, ABLATION_WINDOWS, partial=partial, alpha_noise=alpha_noise, n_draws=n_draws,
                                seed=seed)
            size = f"{n} blocks, {ABLATION_WINDOWS} windows"
            add(partial_name, truth, size, operating(partial_rule, draws["partial"]), null=partial == 0.0)
            if partial == 0.0 and alpha_noise == DEPTH_ALPHA_NOISE:
                add("ρ claim, as the paper reads it, on the same data (the raw ρ cannot tell α from depth)", truth,
                    size, operating(_raw_rho, draws["raw"]), null=False)
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
    window_noise = f"; a window's ΔPPL varies by log-sd {WINDOW_LOG_SD}"
    for name, rule, truths in (
            (f"Last-N ratio's magnitude (ratio ≥ {PAPER_RATIO[0]}, interval above 1)", _magnitude,
             ((1.0, "ratio 1 (no effect)"), (PAPER_RATIO[0], f"ratio {PAPER_RATIO[0]} (the band's bottom)"),
              (2.0, "ratio 2"), (PAPER_RATIO[1], f"ratio {PAPER_RATIO[1]} (the band's top)"))),
            (f"worst/best gap (gap ≥ {PAPER_RATIO[0]}, interval above 1; band up to {PAPER_GAP})", _gap,
             ((1.0, "gap 1 (no effect)"), (PAPER_GAP, f"gap {PAPER_GAP} (the paper's largest)"),
              (100.0, "gap 100 (an overshoot)")))):
        for value, truth in truths:
            for n in WINDOWS:
                add(name, truth, f"{n} windows{window_noise}", operating(rule, ratio_draws(
                    value, n, log_sd=WINDOW_LOG_SD, corr=ARM_CORR, n_draws=n_draws, seed=seed)))
    for kind, truth in (("crosses", f"Last-N ahead below k = {PAPER_CROSSOVER_K}, zone-aware from it, by up to 1 sd "
                                     f"at k = {KS[-1]} (the paper's)"),
                        ("ahead", "zone-aware ahead by 1 sd at every k (no crossover)"),
                        ("none", "no difference at any k")):
        for n in WINDOWS:
            add(f"crossover (winners per k = {KS[0]}–{KS[-1]} from paired intervals)", truth, f"{n} windows",
                operating(_crossover, crossover_draws(crossover_effects(kind), 1.0, n, n_draws=n_draws, seed=seed)))
    for ratio, truth in ((ASYMMETRY_EFFECT, f"std ratio {ASYMMETRY_EFFECT:g} (Q/K carries depth)"),
                         (1.5, "std ratio 1.5"),
                         (1.0, "std ratio 1 (no asymmetry)")):
        for n in BLOCKS:
            add("Q/K–V/O asymmetry (std ratio's interval above 1)", truth, f"{n} layers",
                operating(_asymmetry, asymmetry_draws(ratio, n, n_draws=n_draws, seed=seed)))
    for excess, truth in ((2.0, "block 0 costs 2 sd more than every later block"), (1.0, "block 0 costs 1 sd more"),
                          (0.0, "all blocks alike")):
        for n in ABLATION_BLOCKS:
            d = first_block_draws(excess, n, ABLATION_WINDOWS, n_draws=n_draws, seed=seed)
            words = first_blocks_words(d["delta"], d["low"], d["high"], len(first_blocks(n)))
            add("the first blocks matter most (the costliest first block's interval above every later one's)", truth,
                f"{n} blocks, {ABLATION_WINDOWS} windows", {w: float((words == w).mean()) for w in WORDS})
    for kind, lead, truth in (("reversal", 2.0, "early half leads by 2 sd, then reverses"),
                              ("reversal", 1.0, "early half leads by 1 sd, then reverses"),
                              ("lead only", 2.0, "early half leads by 2 sd, the gap closes by the end, no reversal"),
                              ("none", 0.0, "no wave")):
        for n in LAYERS:
            add("compression wave and its reversal (early half leads, g's later minimum below 0, interval simultaneous "
                "over snapshots)", truth,
                f"{n} layers, {SNAPSHOTS} snapshots",
                operating(_wave, wave_draws(kind, lead, n, n_snapshots=SNAPSHOTS, n_draws=n_draws, seed=seed)))
    for rise, truth in ((2.0, "α rises by 2 block sd over the depth"), (1.0, "α rises by 1 block sd"),
                        (0.0, "flat profile")):
        for n in BLOCKS:
            add("the α profile rises (an inverted U or a rank trend above 0)", truth, f"{n} blocks",
                operating(_shape, shape_draws(rise, n, n_draws=n_draws, seed=seed)))
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
power; where there is no effect (the rows marked *false alarm*), *holds* is its false alarm, and no rule
says it more often than {max_alarm} there (`tests/test_operating.py` fails otherwise). Every interval is a
percentile bootstrap read at the expanded level of Hesterberg (2015), as a t interval with n − 1 degrees of
freedom would be (95% reads at 98.9% with 8 units, 97.8% with 12, 95.6% with 64): the plain percentile
interval covers about 91% with 8 eval windows, and its rules said "holds" 6–7% of the time with no
effect. The ρ rules rank simulated blocks;
the partial ρ (ρ beyond depth) is simulated on the design the book measures, not on a plain rank
correlation: blocks whose α and ΔLoss share a depth trend (α = −block index + noise of sd
{alpha_noise} steps, nearly monotone in depth as the trained runs' weighted α is; or {loose} steps,
loosely ordered), the true ΔLoss falling as exp(−6 · relative depth) with a scatter of {block_sd} of
the first block's ΔLoss, α's own deviation tied to that scatter by the stated correlation (0: the
structured null), each block's ΔLoss measured on {windows} eval windows whose noise is {noise}× that
scatter (half of it shared by all blocks on a window); the chapter's own functions compute it, both
sources of noise resampled, undefined resamples counted. The raw ρ's row on the same data shows
why the partial ρ is scored apart: the raw ρ says "holds" whenever α and ΔLoss share a depth trend;
the paired-difference rule, eval windows; the Δα exponent, training runs whose log Δα scatters
about a power law by the stated run-to-run sd; the Last-N ratio and the worst/best gap, eval
windows on which each arm's ΔPPL is lognormal (log-sd {log_sd}, the two arms' logs correlated
{corr} on a window; the cpu build's SmolLM2 windows vary by about half their mean), read as the
ratio of the arms' means with its paired interval (the gap's two arms are taken as named, not
picked as the worst and the best of several); the crossover, a paired difference at each k = 1–8
whose true mean, in sd of a window's difference, follows the stated curve, each k's winner read
from its interval; the Q/K–V/O asymmetry, layers whose Q/K and V/O values spread in the stated std
ratio; the first blocks, every block's per-window ΔLoss on the ablation's {windows} windows, block 0
costlier by the stated multiple of a window's sd; the wave, a compression grid of {snapshots}
snapshots whose early-minus-late gradient follows the stated curve (in sd of a layer about its
half, half of that variance the layer's own offset at every snapshot), read with the later
minimum's simultaneous interval; the shape, an α profile
rising in a line by the stated multiple of the block-to-block sd, named by the shape rule's rank
trend and curvature intervals. The task-accuracy rule's power is exact, not simulated (Zero-shot
tasks, above). Regenerate the table with `python -m zones.report.operating`.

"""


def operating_section(table: pd.DataFrame, n_draws: int = N_DRAWS) -> str:
    """The Methods section: a heading, what the table shows, and the table."""
    return SECTION.format(n=n_draws, log_sd=WINDOW_LOG_SD, corr=ARM_CORR, windows=ABLATION_WINDOWS,
                          snapshots=SNAPSHOTS, alpha_noise=DEPTH_ALPHA_NOISE, loose=LOOSE_ALPHA_NOISE,
                          block_sd=DEPTH_BLOCK_SD, noise=DEPTH_NOISE, max_alarm=MAX_FALSE_ALARM) + operating_markdown(table)


__all__ = ["MAX_FALSE_ALARM", "NULL_TRUTHS", "ABLATION_BLOCKS", "BLOCKS", "COLUMNS", "KS", "LAYERS", "WINDOWS", "crossover_effects", "operating_markdown",
           "operating_section", "operating_table"]

if __name__ == "__main__":
    print(operating_section(operating_table()), end="")
