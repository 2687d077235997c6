"""The chapters' numbers and verdicts: one module per chapter, and the claims scorecard.

Each chapter module has a ``run(...)`` that does the chapter's work through the analysis
modules, writes its tables and ``summary.json`` to ``out_dir`` and returns a
:class:`~zones.report.common.ChapterResult` (tables, and the plain numbers and sentences
the page glues). ``verdicts`` holds the verdict vocabulary, the paper's figures and the rules
the chapters share with the scorecard (``claims``), so no chapter module imports the
scorecard. Every verdict a page states is made here, by a tested function with its
rule in the docstring; the notebooks only call ``run``, glue, draw and tell.
"""
from . import (alpha_profile, claims, common, depth_series, healing, importance, layer_ablation, lifecycle, predictors,
               pruning, sublayers, verdicts)

__all__ = ["alpha_profile", "claims", "common", "depth_series", "healing", "importance", "layer_ablation", "lifecycle",
           "predictors", "pruning", "sublayers", "verdicts"]
