"""Every chapter's charts, built from tiny tables as the chapters call them, compile with no
Vega-Lite warning ("Conflicting scale range": two strategies painted one colour), no legend whose
symbols look alike for series drawn differently (a dash channel shown as identical dots) and
no text under 10 px, in both layouts (laptop and phone): ``zones.figures.spec_problems``."""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd
import pytest

from zones import figures

RNG = np.random.default_rng(0)
STRATEGIES = ["zone_aware", "last_n", "last_n_keep_last", "random_protected", "greedy"]
KS = [1, 2, 3]


def _interval(df: pd.DataFrame, column: str, spread: float = 0.2) -> pd.DataFrame:
    return df.assign(**{f"{column}_low": df[column] * (1 - spread), f"{column}_high": df[column] * (1 + spread)})


# --- the tiny tables --------------------------------------------------------------------------------

def pruning_summary() -> pd.DataFrame:
    rows = [dict(strategy=s, k=k, delta_ppl=float(2 ** k * (i + 1)), delta_ppl_min=float(2 ** k * (i + 0.8)),
                 delta_ppl_max=float(2 ** k * (i + 1.2)), n_seeds=3 if "random" in s else 1, ppl=30.0 + k)
            for i, s in enumerate(STRATEGIES) for k in KS]
    return _interval(pd.DataFrame(rows), "delta_ppl")


def crossover() -> pd.DataFrame:
    rows = []
    for reference in ("last_n", "last_n_keep_last", "random_protected"):
        for k in KS:
            ratio = 0.6 + 0.5 * k
            rows.append(dict(reference=reference, k=k, ratio=ratio, ratio_low=ratio * 0.8, ratio_high=ratio * 1.25,
                             status="collapsed" if (reference == "last_n" and k == 3) else "ratio",
                             reference_delta_ppl=ratio * 4, ours_delta_ppl=4.0,
                             winner="zone_aware" if ratio > 1 else reference))
    return pd.DataFrame(rows)


def removed() -> tuple[pd.DataFrame, pd.DataFrame]:
    layers = np.arange(30)
    zones = pd.DataFrame(dict(layer=layers, alpha=0.3 + 0.01 * layers, zone_rank=layers // 10,
                              zone_mean=0.3 + 0.1 * (layers // 10)))
    plans = pd.DataFrame([dict(strategy=s, k=4, seed=0, removed=",".join(map(str, [12 + i, 20 - i, 3 + i, 27 - i])))
                          for i, s in enumerate(STRATEGIES)])
    return zones, plans


def ablation(models=("m",)) -> pd.DataFrame:
    rows = [dict(model=m, layer=l, delta_loss=(0.5 / (l + 1)) * (1 if l != 5 else -1), alpha=0.3 + 0.02 * l,
                 loss=3.0, base_loss=2.9) for m in models for l in range(30)]
    return _interval(pd.DataFrame(rows), "delta_loss", 0.3)


def series_importance() -> pd.DataFrame:
    rows = [dict(model=f"D{d} s{s}", depth=d, seed=s, layer=l, delta_loss=0.1 / (l + 1) + 0.001 * s,
                 alpha=0.3 + 0.02 * l + 0.01 * s)
            for d, seeds in ((8, 2), (12, 1), (16, 1)) for s in range(seeds) for l in range(d)]
    return _interval(pd.DataFrame(rows), "delta_loss", 0.3)


def history() -> pd.DataFrame:
    return pd.DataFrame([dict(depth=d, seed=s, step=t, heldout_loss=5.0 - 0.1 * t / 10 - 0.01 * s)
                         for d, seeds in ((8, 2), (12, 1)) for s in range(seeds) for t in (0, 10, 20)])


def rho_tables() -> tuple[pd.DataFrame, pd.DataFrame]:
    runs = pd.DataFrame([dict(depth=d, seed=s, rho=0.3, ci_low=-0.1, ci_high=0.6, p_value=0.2)
                         for d, seeds in ((8, 2), (12, 1)) for s in range(seeds)])
    pooled = pd.DataFrame([dict(depth=str(d), rho=0.3, ci_low=0.0, ci_high=0.5, p_value=0.04, n_runs=n)
                           for d, n in (("8", 2), ("12", 1), ("all", 3))])
    return runs, pooled


def lifecycle_tables() -> dict:
    groups = ["Q/K", "V/O", "MLP", "all"]
    grid = pd.DataFrame([dict(depth=d, group=g, layer=l, step=t, value=RNG.random())
                         for d in (8, 16) for g in groups for l in range(d) for t in (0, 50, 100)])
    gradient = pd.DataFrame([dict(depth=d, group=g, step=t, gradient=RNG.normal())
                             for d in (8, 16) for g in groups for t in (0, 50, 100)])
    profile = pd.DataFrame([dict(depth=d, group=g, layer=l, relative_depth=l / (d - 1), value=RNG.random())
                            for d in (8, 16) for g in groups for l in range(d)])
    runs = pd.DataFrame([dict(depth=d, seed=s, delta_alpha=0.1 * d ** -0.5 * (1 + 0.1 * s), n_late=3)
                         for d, seeds in ((8, 2), (12, 1), (16, 1)) for s in range(seeds)])
    return dict(grid=grid, gradient=gradient, profile=profile, runs=runs)


def primer_tables() -> dict:
    from zones.spectra.described import describe_all, mp_curves, tail_grid
    from zones.spectra.random import gaussian_matrix, student_t_matrix

    entries = [dict(matrix_label="Gaussian 40×80", kind="gaussian", source="N(0, 1)", layer=-1, role="",
                    matrix=gaussian_matrix(40, 80, seed=0)),
               dict(matrix_label="Student-t ν = 1.5", kind="heavy-tailed", source="t", layer=-1, role="",
                    matrix=student_t_matrix(40, 80, 1.5, seed=0)),
               dict(matrix_label="trained", kind="trained", source="m", layer=1, role="q",
                    matrix=student_t_matrix(40, 80, 3.0, seed=1))]
    described, pictures = describe_all(entries, (0.0, 0.5), 20)
    matrices = pd.DataFrame(described)
    return dict(matrices=matrices, mp_curve=mp_curves(matrices), **pictures,
                **tail_grid(40, 80, [1.0, 1.5, 4.0], seed=0, bins=20))


# --- every chapter's charts -------------------------------------------------------------------------

def charts() -> dict:
    from zones.figures import across_models, alpha_profile, depth_series, healing, layer_ablation, predictors
    from zones.figures import primer, pruning, spectral_lifecycle, sublayers, task_accuracy

    summary = pruning_summary()
    zones_table, plans = removed()
    out = {
        "pruning bars": pruning.delta_ppl_bars(summary, ["zone_aware", "last_n", "random_protected"]),
        "pruning crossover": pruning.crossover_stack(crossover()),
        "pruning baselines": pruning.delta_ppl_lines(summary, STRATEGIES),
        "pruning recipe": pruning.delta_ppl_lines(summary, STRATEGIES[:3], dashed=STRATEGIES[1:3]),
        "pruning removed": pruning.removed_on_profile(zones_table, plans, 4, STRATEGIES),
        "ablation bars": layer_ablation.ablation_bars(ablation(("a", "b"))),
        "importance scatter": layer_ablation.importance_scatter(ablation(), titles={"m": "m: ρ = 0.3"}),
        "series loss": depth_series.loss_curves_by_seed(history()),
        "series ablation": depth_series.ablation_by_depth(series_importance()),
        "series importance": depth_series.importance_by_depth(series_importance()),
        "series rho": depth_series.rho_intervals(*rho_tables()),
    }
    life = lifecycle_tables()
    out.update({
        "lifecycle compression": spectral_lifecycle.lifecycle_heatmap(life["grid"], "compression", "compression",
                                                                      scheme="magma", reverse=True),
        "lifecycle wave": spectral_lifecycle.wave_gradient_lines(life["gradient"]),
        "lifecycle profiles": spectral_lifecycle.final_profiles(life["profile"]),
        "lifecycle scaling": spectral_lifecycle.delta_alpha_scaling(life["runs"], -0.5, "fit: b = −0.50 [−0.86, −0.15]",
                                                                    0.26, title="Δα of all matrices against depth"),
    })
    sub_rows = [dict(strategy=s, kind=kind, k=k, removed="1", n_params=k * 1e6 * (2 if kind == "block" else 1),
                     delta_loss=0.1 * k, kl=0.1, top1=0.9)
                for s, kind in (("zone_aware", "block"), ("block_influence", "block"), ("attn_drop", "sublayer"),
                                ("sublayer_similarity", "sublayer"), ("zone_aware_attn", "sublayer")) for k in KS]
    sub_importance = pd.DataFrame([dict(part=p, layer=l, alpha=0.3 + 0.01 * l, delta_loss=0.01 * (l + 1) - 0.02)
                                   for p in ("attn", "mlp") for l in range(8)])
    out.update({
        "sublayer importance": sublayers.sublayer_scatter(_interval(sub_importance, "delta_loss")),
        "sublayer tradeoff": sublayers.params_tradeoff(_interval(pd.DataFrame(sub_rows), "delta_loss")),
    })
    heal = ["zone_aware", "last_n_keep_last", "greedy", "random_protected"]
    delta = pd.DataFrame([dict(strategy=s, stage=st, k=k, delta_loss=0.5 * k, n_seeds=1)
                          for s in heal for st in ("pruned", "bridge", "lora") for k in (2, 4)])
    gain = pd.DataFrame([dict(strategy=s, k=k, method=m, gain=-0.1 * k)
                         for s in heal for k in (2, 4) for m in ("bridge", "lora")])
    accuracy = pd.DataFrame([dict(strategy=s, task=t, accuracy=0.4, n=200, n_seeds=1)
                             for s in ["full"] + heal for t in ("arc", "piqa", "all")])
    versus = pd.DataFrame([dict(task="all", strategy=s, reference="full", difference=-0.05, n=200) for s in heal])
    between = pd.DataFrame([dict(task="all", strategy=a, reference=b, difference=0.01, n=200)
                            for i, a in enumerate(heal) for b in heal[i + 1:]])
    out.update({
        "healing bars": healing.delta_before_after(_interval(delta, "delta_loss"), heal, ["pruned", "bridge", "lora"]),
        "healing gain": healing.healing_gain(_interval(gain, "gain"), heal),
        "task accuracy": task_accuracy.accuracy_bars(_interval(accuracy, "accuracy", 0.1), ["full"] + heal,
                                                     ["arc", "piqa", "all"]),
        "task differences": task_accuracy.differences(_interval(versus, "difference", 1.0),
                                                      _interval(between, "difference", 2.0)),
    })
    rhos = pd.DataFrame([dict(predictor=p, kind=k, rho=r, ci_low=r - 0.2, ci_high=r + 0.2, p_value=0.1, abs_rho=abs(r))
                         for p, k, r in (("alpha_shape", "spectral", 0.3), ("stable_rank", "spectral", -0.2),
                                         ("block_index", "simple", 0.5))])
    alpha = pd.DataFrame([dict(layer=l, role=r, alpha_shape=0.3 + 0.01 * l, alpha_shape_r2=0.9, alpha_esd=3.0,
                               alpha_esd_sigma=0.2, alpha_hill=2.5, n_tail=20)
                          for l in range(30) for r in ("q", "k", "v", "o", "mlp_gate", "mlp_up", "mlp_down")])
    models = pd.DataFrame([dict(model=m, rho=r, rho_low=r - 0.3, rho_high=r + 0.3, rho_p=0.1, rho_claim=c)
                           for m, r, c in (("a", 0.4, "holds"), ("b", -0.1, "inconclusive"))])
    profiles = pd.DataFrame([dict(model=m, layer=l, relative_depth=l / 9, alpha=0.3 + 0.01 * l, delta_loss=0.1 / (l + 1))
                             for m in ("a", "b") for l in range(10)])
    out.update({
        "predictors": predictors.rho_intervals(rhos),
        "alpha profile": alpha_profile.alpha_profile_bars(alpha),
        "alpha roles": alpha_profile.alpha_by_role(alpha),
        "alpha estimators": alpha_profile.estimators_by_depth(alpha),
        "across rho": across_models.rho_by_model(models, (0.2, 0.6)),
        "across profiles": across_models.profiles_on_depth(profiles[["model", "layer", "relative_depth", "alpha"]],
                                                           _interval(profiles, "delta_loss")),
    })
    p = primer_tables()
    names = list(p["matrices"]["matrix"])
    out.update({
        "primer mp": primer.mp_histogram(p["eigenvalues"], p["mp_curve"], names[0]),
        "primer twins": primer.twin_comparison(p["density"], p["mp_curve"], p["matrices"], names[:2]),
        "primer rank": primer.rank_fits(p["rank"], p["matrices"], names),
        "primer esd": primer.density_fits(p["density"], p["density_line"], p["matrices"], names),
        "primer slider": primer.tail_slider(p["tail_grid"], p["tail_density"], p["tail_line"], p["tail_rank"], start=1.5),
    })
    return out


CHARTS = charts()


@pytest.mark.parametrize("name", sorted(CHARTS))
def test_every_chart_compiles_without_a_warning_a_blind_legend_or_tiny_text(name):
    assert figures.spec_problems(CHARTS[name].to_dict()) == []


# --- the checks themselves --------------------------------------------------------------------------

def _lines() -> pd.DataFrame:
    return pd.DataFrame(dict(x=[0, 1, 0, 1], y=[1, 2, 1.5, 2.5], s=["a", "a", "b", "b"]))


def test_a_dash_legend_of_dots_is_caught_and_the_dash_legend_is_not():
    dots = alt.Chart(_lines()).mark_line(point=True).encode(x="x:Q", y="y:Q", strokeDash="s:N")
    assert any("look alike" in p for p in figures.spec_problems(dots.to_dict()))
    base = alt.Chart(_lines()).encode(x="x:Q", y="y:Q", detail="s:N")
    dashes = base.mark_line().encode(strokeDash=alt.StrokeDash("s:N", legend=figures.DASH_LEGEND)) + base.mark_point()
    assert figures.spec_problems(dashes.to_dict()) == []


def test_one_colour_scale_with_two_ranges_is_caught():
    df = pd.DataFrame(dict(region=["zone_aware wins", "last_n wins"], x=[0, 1]))

    def panel(other, colour):
        return alt.Chart(df.assign(region=["zone_aware wins", other])).mark_rect().encode(
            x="x:Q", color=alt.Color("region:N", scale=alt.Scale(domain=["zone_aware wins", other],
                                                                 range=["#1f77b4", colour])))
    problems = figures.spec_problems(alt.vconcat(panel("last_n wins", "#ff7f0e"),
                                                 panel("random_protected wins", "#c7c7c7")).to_dict())
    assert any("Conflicting scale" in p and "range" in p for p in problems)


def test_text_under_ten_pixels_is_caught():
    small = alt.Chart(_lines()).mark_text(fontSize=8).encode(x="x:Q", y="y:Q", text="s:N")
    assert figures.spec_problems(small.to_dict()) == ["wide: fontSize 8 px (at least 10)"]


def test_the_crossover_regions_each_have_their_own_colour():
    spec = CHARTS["pruning crossover"].to_dict()
    scales = [layer["encoding"]["color"]["scale"] for panel in spec["vconcat"] for layer in panel["layer"]
              if "color" in layer.get("encoding", {})]
    assert len({str(s) for s in scales}) == 1                       # one scale for the three panels
    assert len(set(scales[0]["range"])) == len(scales[0]["domain"]) == 4   # zone_aware + three references


def test_the_phone_layout_drops_the_labels_that_would_pile_up_and_stacks_legends():
    removed_spec = CHARTS["pruning removed"].to_dict()
    narrow = figures.narrow_spec(removed_spec)
    assert "zones_wide_only_turns" in str(removed_spec) and "zones_wide_only" not in str(narrow)
    assert narrow["config"]["legend"]["layout"]["bottom"]["direction"] == "vertical"
    x_axis = removed_spec["vconcat"][0]["encoding"]["x"]["axis"]
    assert x_axis["labelOverlap"] == "parity" and x_axis["labelAngle"] == 0
    marked = str(figures.narrow_spec(CHARTS["series importance"].to_dict()))
    assert "datum.mark != 'other'" in marked and "datum.mark == 'other'" not in marked


def test_the_scaling_legend_reports_the_number_it_is_given():
    spec = CHARTS["lifecycle scaling"].to_dict()
    lines = {row["line"] for rows in spec["datasets"].values() for row in rows if "line" in row}
    assert lines == {"fit: b = −0.50 [−0.86, −0.15]", "paper: b = 0.26"}
    assert spec["title"] == "Δα of all matrices against depth"
