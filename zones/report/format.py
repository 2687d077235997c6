"""Numbers, intervals and tables as a reader sees them: the one formatting helper of the book.

Every chapter's glue and every table shown in a page go through these functions, so the book
writes numbers one way:

- significant figures, not fixed decimals (``fmt_num(0.012345) -> "0.0123"``), and powers of
  ten for the very large or small (``fmt_num(22369156.15) -> "2.24 × 10⁷"``);
- a true minus sign (``−``), not a hyphen;
- an estimate with its interval as ``"0.19 [−0.20, 0.54]"`` (``fmt_interval``), the bounds to
  as many decimals as the interval's width deserves;
- ratios as ``"3.2×"``, and beyond ``cap`` as ``"> 10⁴×"`` (``fmt_ratio``);
- losses and perplexities always labelled: ``fmt_nats(0.123) -> "0.123 nats"``,
  ``fmt_ppl(23.41) -> "perplexity 23.4"``, ``fmt_delta_ppl(3.2) -> "ΔPPL +3.20"``;
- NaN as ``"n/a"`` (the prose says why), never as a plausible number.

``display_table`` shows a DataFrame rounded the same way inside a box that scrolls
sideways (the CSVs keep full precision), and ``csv_links`` links a chapter's CSV files for
download: a MyST ``{download}`` role per file, which Jupyter Book 1.x copies into the built
book (``_downloads/``), so the links work offline.
"""
from __future__ import annotations

import html
import math
import os
import re
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd
from IPython.display import Markdown

MINUS = "\u2212"
SUPERSCRIPTS = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")
NA = "n/a"
SCIENTIFIC_ABOVE = 1e4   # |x| at or above this is written as m × 10ⁿ
SCIENTIFIC_BELOW = 1e-3  # non-zero |x| below this too


def _minus(text: str) -> str:
    return text.replace("-", MINUS)


def _finite(x) -> float | None:
    """``x`` as a float, or None for NaN/None (±inf is kept)."""
    if x is None:
        return None
    value = float(x)
    return None if math.isnan(value) else value


def _exponent(x: float) -> int:
    return int(math.floor(math.log10(abs(x))))


def power_of_ten(exponent: int) -> str:
    """``10ⁿ`` with a superscript exponent: ``power_of_ten(-4) -> "10⁻⁴"``."""
    return "10" + str(int(exponent)).translate(SUPERSCRIPTS)


def _decimals(x: float, digits: int) -> int:
    """Decimals that give ``x`` its ``digits`` significant figures (after rounding)."""
    if x == 0:
        return max(digits - 1, 0)
    decimals = max(digits - 1 - _exponent(x), 0)
    rounded = round(x, decimals)
    if rounded != 0 and _exponent(rounded) != _exponent(x):  # 0.9996 -> 1.00, not 1.000
        decimals = max(digits - 1 - _exponent(rounded), 0)
    return decimals


def _fixed(x: float, decimals: int, signed: bool = False) -> str:
    text = f"{x:{'+' if signed else ''},.{decimals}f}"
    if float(text.replace(",", "")) == 0:  # no "−0.00"
        text = text.replace("-", "+" if signed else "")
    return _minus(text)


def _scientific(x: float, digits: int, signed: bool = False) -> str:
    exponent = _exponent(x)
    mantissa = round(x / 10 ** exponent, max(digits - 1, 0))
    if abs(mantissa) >= 10:
        exponent, mantissa = exponent + 1, mantissa / 10
    return f"{_fixed(mantissa, max(digits - 1, 0), signed)} × {power_of_ten(exponent)}"


def fmt_list(items) -> str:
    """``"a"``, ``"a and b"``, ``"a, b and c"``: items in a sentence."""
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" and {items[-1]}"


def fmt_num(x, digits: int = 3, signed: bool = False) -> str:
    """``x`` to ``digits`` significant figures; powers of ten outside [10⁻³, 10⁴).

    >>> fmt_num(0.012345), fmt_num(649812.71), fmt_num(-1.5), fmt_num(1234.5)
    ('0.0123', '6.50 × 10⁵', '−1.50', '1,230')
    """
    value = _finite(x)
    if value is None:
        return NA
    if math.isinf(value):
        return ("+" if signed and value > 0 else "") + ("∞" if value > 0 else MINUS + "∞")
    if value == 0:
        return "0"
    if value != 0 and not SCIENTIFIC_BELOW <= abs(value) < SCIENTIFIC_ABOVE:
        return _scientific(value, digits, signed)
    decimals = _decimals(value, digits)
    if decimals == 0:  # 1234.5 at 3 figures: 1,230
        value = round(value, digits - 1 - _exponent(value)) if value else 0.0
    return _fixed(value, decimals, signed)


def fmt_int(n) -> str:
    """A count with thousands separators: ``fmt_int(16320) -> "16,320"``."""
    value = _finite(n)
    return NA if value is None else _minus(f"{int(round(value)):,}")


IRREGULAR = {"matrix": "matrices", "is": "are", "was": "were", "this": "these"}


def plural(n, word: str, many: str | None = None) -> str:
    """``n`` and ``word`` in the number it takes: ``plural(1, "seed") -> "1 seed"``,
    ``plural(20, "seed") -> "20 seeds"``, ``plural(2, "matrix") -> "2 matrices"`` (``many``: the
    plural where adding "s" is wrong and :data:`IRREGULAR` does not know it). The count as
    :func:`fmt_int` writes it. The one place the book makes a noun agree with its number: never
    "1 seeds", "1 runs" or "window(s)"."""
    value = _finite(n)
    if value is None:
        return f"{NA} {many or IRREGULAR.get(word, word + 's')}"
    return f"{fmt_int(value)} {word if value == 1 else (many or IRREGULAR.get(word, word + 's'))}"


def seeds_phrase(n) -> str:
    """What a seeded strategy's number is: ``"the median over 20 seeds"``, or with one seed
    ``"its one seed"`` (a median over one seed is that seed)."""
    return "its one seed" if int(n) == 1 else f"the median over {plural(n, 'seed')}"


def fmt_interval(estimate, low, high, digits: int = 2, unit: str = "", signed: bool = False) -> str:
    """``"0.19 [−0.20, 0.54]"``: the estimate and its interval, to the decimals that give the
    interval's width ``digits`` significant figures; ``unit`` follows (``"… nats"``).
    ``estimate=None`` writes the interval alone, the same way: ``"[−0.20, 0.54]"``.

    Values of 10⁴ or more are written each in scientific form. A missing bound gives
    ``"0.19 [n/a]"``.
    """
    bare = estimate is None
    est, lo, hi = (0.0 if bare else _finite(estimate)), _finite(low), _finite(high)
    suffix = f" {unit}" if unit else ""
    if est is None:
        return NA
    head = "" if bare else f"{fmt_num(est, digits + 1, signed)} "
    if lo is None or hi is None or math.isinf(lo) or math.isinf(hi):
        bounds = NA if lo is None or hi is None else f"{fmt_num(lo, digits, signed)}, {fmt_num(hi, digits, signed)}"
        return f"{head}[{bounds}]{suffix}"
    if max(abs(est), abs(lo), abs(hi)) >= SCIENTIFIC_ABOVE:
        parts = [fmt_num(v, digits + 1, signed) for v in (est, lo, hi)]
    else:
        width = abs(hi - lo)
        reference = width if width > 0 else max(abs(est), abs(lo)) if bare else abs(est)
        decimals = _decimals(reference, digits) if reference > 0 else digits
        decimals = min(decimals, 8)
        parts = [_fixed(v, decimals, signed) for v in (est, lo, hi)]
    return f"{'' if bare else parts[0] + ' '}[{parts[1]}, {parts[2]}]{suffix}"


def fmt_rho(rho, low, high, p_value=None) -> str:
    """A rank correlation with its interval (:func:`fmt_interval`) and, when given, its p-value
    (:func:`fmt_p`): ``"ρ = 0.14 [−0.25, 0.52], p = 0.031"``."""
    text = f"ρ = {fmt_interval(rho, low, high)}"
    return text if p_value is None else f"{text}, {fmt_p(p_value)}"


def fmt_ratio(ratio, digits: int = 2, cap: float = 1e4) -> str:
    """A ratio with ``×``: ``"3.2×"``; beyond ``cap`` (or infinite) ``"> 10⁴×"``, below
    ``1/cap`` ``"< 10⁻⁴×"``."""
    value = _finite(ratio)
    if value is None:
        return NA
    cap_exponent = round(math.log10(cap))
    if value > cap:
        return f"> {power_of_ten(cap_exponent)}×"
    if 0 <= value < 1 / cap:
        return f"< {power_of_ten(-cap_exponent)}×"
    return f"{fmt_num(value, digits)}×"


def fmt_nats(x, digits: int = 3, signed: bool = False) -> str:
    """A loss or a loss difference in nats: ``fmt_nats(0.123) -> "0.123 nats"``."""
    text = fmt_num(x, digits, signed)
    return text if text == NA else f"{text} nats"


def fmt_ppl(x, digits: int = 3) -> str:
    """A perplexity, labelled: ``fmt_ppl(23.41) -> "perplexity 23.4"``."""
    text = fmt_num(x, digits)
    return text if text == NA else f"perplexity {text}"


def fmt_delta_ppl(x, digits: int = 3) -> str:
    """A change of perplexity, labelled and signed: ``fmt_delta_ppl(3.2) -> "ΔPPL +3.20"``."""
    text = fmt_num(x, digits, signed=True)
    return text if text == NA else f"ΔPPL {text}"


def fmt_pct(fraction, digits: int = 2) -> str:
    """A fraction as a percentage: ``fmt_pct(0.1234) -> "12%"``."""
    value = _finite(fraction)
    return NA if value is None else f"{fmt_num(100 * value, digits)}%"


def fmt_p(p, digits: int = 2, floor: float = 1e-3) -> str:
    """A p-value: ``"p = 0.031"``, or ``"p < 0.001"`` below ``floor``."""
    value = _finite(p)
    if value is None:
        return f"p = {NA}"
    if value < floor:
        return f"p < {fmt_num(floor, 1)}"
    return f"p = {fmt_num(value, digits)}"


def for_glue(value, digits: int = 3):
    """What a chapter glues for its prose: a float as ``fmt_num`` text (so the page writes it
    like every other number), a count of 10⁴ or more with separators, anything else as it is."""
    if isinstance(value, (bool, np.bool_)) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, np.integer)):  # numpy integers like python ones
        value = int(value)
        return value if abs(value) < 10_000 else fmt_int(value)
    if isinstance(value, (float, np.floating)):
        return fmt_num(float(value), digits)
    return value


def rounded_to(values: Iterable[float], most: int = 4) -> int | None:
    """The decimals (0 … ``most``) a column of floats was already rounded to, or ``None``:
    ``rounded_to([0.02, 0.15]) -> 2``. A column rounded upstream must not be shown with more
    decimals than it has (0.0238 rounded to 0.02 is not "0.0200")."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not finite:
        return None
    for decimals in range(most + 1):
        if all(abs(v - round(v, decimals)) <= 1e-12 * max(1.0, abs(v)) for v in finite):
            return decimals
    return None


def _honest(x, digits: int, cap: int | None) -> str:
    """``fmt_num``, but never with more than ``cap`` decimals (the precision the value has)."""
    text = fmt_num(x, digits)
    value = _finite(x)
    if cap is None or value is None or math.isinf(value) or value == 0 or text.count("×"):
        return text
    return _fixed(value, cap) if _decimals(value, digits) > cap else text


def rounded(table: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """The table with every float cell written by ``fmt_num`` (strings; for display only); a
    column already rounded upstream keeps its decimals (:func:`rounded_to`), never padded."""
    shown = table.copy()
    for column in shown.columns:
        if pd.api.types.is_float_dtype(shown[column]):
            cap = rounded_to(shown[column])
            shown[column] = shown[column].map(lambda v, cap=cap: _honest(v, digits, cap))
        elif pd.api.types.is_integer_dtype(shown[column]) and not pd.api.types.is_bool_dtype(shown[column]):
            shown[column] = shown[column].map(lambda v: f"{int(v)}" if abs(int(v)) < 10_000 else fmt_int(v))
    return shown


MARKUP = re.compile(r"([!-/:-@\[-`{-~])")  # every ASCII punctuation mark: Markdown may read any of them


# an escaped _ or / followed by more text, or an escaped comma inside a word but not between
# digits (a list "0:attn,1:attn" may wrap there; "1,009" may not)
BREAK_AFTER = re.compile(r"(\\[_/](?=\S)|(?<!\d)\\,(?=\S)|\\,(?=[^\s\d]))")


def md_escape(text) -> str:
    """``text`` as literal MyST Markdown inline text: every ASCII punctuation mark escaped (so
    ``*``, ``_``, ``$``, ``{role}`` or a leading ``1.`` stay characters), line breaks as spaces,
    and a break opportunity after each ``_``, ``/`` and ``,`` inside a word (a long name such as
    ``zone_aware_no_protection``, a path, or a list ``0:attn,1:attn`` wraps there instead of
    widening its column), never inside a number (``1,009``)."""
    escaped = MARKUP.sub(r"\\\1", " ".join(str(text).split()))
    return BREAK_AFTER.sub(r"\1<wbr>", escaped)


def _fence(body: str) -> str:
    """A colon fence longer than any run of colons in ``body`` (``:::`` when there is none)."""
    runs = [len(run) for run in re.findall(r":{3,}", body)]
    return ":" * max([3] + [n + 1 for n in runs])


def list_table(header: list[list[str]], body_rows: list[list[str]], caption: str | None = None,
               name: str | None = None, classes: Iterable[str] = (), stub_columns: int = 0) -> str:
    """A MyST ``{list-table}`` directive: header rows ``header`` and body rows ``body_rows`` of cells
    already in Markdown (see :func:`md_escape`), with ``caption`` (plain text) and ``name``.

    Displayed as a ``text/markdown`` output, the book parses it into a real table (the book
    sets ``nb_render_markdown_format: myst``): with a caption and a name, Sphinx numbers it
    ("Table 3") and ``{numref}`` cites it by ``name``.
    """
    width = len(body_rows[0]) if body_rows else len(header[0]) if header else 0
    if any(len(r) != width for r in [*header, *body_rows]):
        raise ValueError("every row of a table needs the same number of cells")
    if name is not None and not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", name):
        raise ValueError(f"table name {name!r}: use letters, digits, '-' and '_' (it becomes the page's anchor)")
    options = [f":header-rows: {len(header)}", ":widths: auto"]
    if stub_columns:
        options.append(f":stub-columns: {stub_columns}")
    if name:
        options.append(f":name: {name}")
    if classes:
        options.append(f":class: {' '.join(classes)}")
    lines = []
    for row in [*header, *body_rows]:
        cells = [cell.strip() or "\u00a0" for cell in row]  # an empty item would end the list
        lines.append(f"* - {cells[0]}")
        lines += [f"  - {cell}" for cell in cells[1:]]
    body = "\n".join(options) + "\n\n" + "\n".join(lines)
    fence = _fence(body)
    title = f" {md_escape(caption)}" if caption else ""
    return f"{fence}{{list-table}}{title}\n{body}\n{fence}\n"


def _labels(index: pd.Index) -> list[list[str]]:
    """The levels of a (Multi)Index as rows of labels, a repeated label left blank after its first."""
    levels = index.nlevels
    values = [tuple(v) if levels > 1 else (v,) for v in index]
    rows = []
    for level in range(levels):
        row, previous = [], None
        for value in values:
            key = value[:level + 1]
            row.append("" if key == previous else str(value[level]))
            previous = key
        rows.append(row)
    return rows


class DisplayTable:
    """A DataFrame shown rounded: in the book a numbered table (a MyST ``{list-table}`` with its
    caption and ``name``), in JupyterLab the same rounded table as HTML."""

    def __init__(self, table: pd.DataFrame, digits: int = 3, caption: str | None = None, index: bool = False,
                 name: str | None = None, cards: bool = False):
        self.data, self.digits, self.caption, self.index = table, digits, caption, index
        self.name = name if name or not caption else _caption_name(caption)
        self.cards = cards

    def classes(self) -> list[str]:
        """``zones-table`` (the book's table style) and ``zones-cards`` when its rows become
        labelled cards at a phone's width."""
        return ["zones-table"] + (["zones-cards"] if self.cards else [])

    def markdown(self) -> str:
        """The table as a MyST ``{list-table}`` (see :func:`list_table`)."""
        shown = rounded(self.data, self.digits)
        stubs = shown.index.nlevels if self.index else 0
        column_rows = _labels(shown.columns)
        header = []
        for i, labels in enumerate(column_rows):
            last = i == len(column_rows) - 1
            names = [str(n) if last and n is not None else "" for n in shown.index.names] if stubs else []
            header.append([md_escape(v) for v in names + labels])
        index_cells = list(zip(*_labels(shown.index))) if stubs else [()] * len(shown)
        rows = [[md_escape(v) for v in (*stub, *values)]
                for stub, values in zip(index_cells, shown.itertuples(index=False, name=None))]
        return list_table(header, rows, self.caption, self.name, self.classes(), stubs)

    def _repr_markdown_(self) -> str:
        return self.markdown()

    def _repr_html_(self) -> str:
        styler = rounded(self.data, self.digits).style
        if not self.index:
            styler = styler.hide(axis="index")
        if self.caption:
            styler = styler.set_caption(html.escape(self.caption))
        return f'<div class="{" ".join(self.classes())}">{styler.to_html()}</div>'

    def __repr__(self) -> str:
        return rounded(self.data, self.digits).to_string(index=self.index)


def _caption_name(caption: str) -> str:
    """A name for a captioned table given none (so that it is still numbered): ``table-`` and
    a digest of the caption."""
    import hashlib

    return "table-" + hashlib.sha1(caption.encode()).hexdigest()[:10]


def display_table(table: pd.DataFrame, digits: int = 3, caption: str | None = None,
                  index: bool = False, name: str | None = None, cards: bool = False) -> DisplayTable:
    """What a page shows of ``table``: its floats to ``digits`` significant figures, as a table
    the book numbers ("Table 3", with ``caption``) and ``{numref}`` cites by ``name``; ``index``
    shows the row labels as the first column(s); ``cards`` turns each row into a labelled card
    at a phone's width. Display it (last line of a cell, or ``IPython.display.display``)."""
    return DisplayTable(table, digits, caption, index, name, cards)


def csv_links(out_dir: str | os.PathLike, names: Iterable[str] | None = None, start: str | os.PathLike | None = None):
    """A Markdown line linking the chapter's CSV tables for download (full precision).

    Each file becomes a MyST ``{download}`` role with its path relative to ``start`` (the
    notebook's working directory, where the book resolves it); Jupyter Book copies the files
    into the build. Raises ``FileNotFoundError`` when a named table was not written.
    """
    folder = Path(out_dir)
    files = sorted(folder.glob("*.csv")) if names is None else [folder / n for n in names]
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        raise FileNotFoundError(f"cannot link {', '.join(missing)}: the chapter did not write it; re-run the chapter")
    if not files:
        raise FileNotFoundError(f"no CSV tables in {folder} to link; re-run the chapter")
    base = Path(start) if start is not None else Path.cwd()
    links = [f"{{download}}`{f.name} <{Path(os.path.relpath(f.resolve(), base.resolve())).as_posix()}>`"
             for f in files]
    return Markdown("**Download the tables** (CSV, full precision): " + " · ".join(links))
