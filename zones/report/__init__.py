"""The chapters' numbers and verdicts: one module per chapter, and the claims scorecard.

Each chapter module has a ``run(...)`` that does the chapter's work through the analysis
modules, writes its tables and ``summary.json`` to ``out_dir`` and returns a
:class:`~zones.report.common.ChapterResult` (tables, and the plain numbers and sentences
the page glues). ``verdicts`` holds the verdict vocabulary, the paper's figures and the rules
the chapters share with the scorecard (``claims``), so no chapter module imports the
scorecard. Every verdict a page states is made here, by a tested function with its
rule in the docstring; the notebooks only call ``run``, glue, draw and tell.
"""
import importlib

CHAPTERS = ("primer", "alpha_profile", "layer_ablation", "importance_vs_alpha", "pruning", "healing", "sublayers",
            "predictors", "depth_series", "spectral_lifecycle", "across_models", "claims", "teaching")
__all__ = [*CHAPTERS, "common", "format", "verdicts"]


def __getattr__(name: str):
    """``report.pruning`` imports the chapter module on first use (``zones.report.format`` alone stays light)."""
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
