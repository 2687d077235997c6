"""Write a clean .ipynb from a plain-text source: the way this repo's notebooks are authored.

Source format: cells separated by lines "# %% [markdown]" or "# %%" (code); a code cell
whose marker line is "# %% tags=parameters" (or any comma-separated tags) gets those tags.
Markdown cell lines are written without a leading "# ".

    python tools/make_notebook.py notebooks/src/alpha_profile.py notebooks/alpha_profile.ipynb
"""
import sys

import nbformat


def parse(text: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                   "language_info": {"name": "python"}}
    cells, kind, tags, lines = [], None, [], []

    def flush():
        if kind is None:
            return
        body = "\n".join(lines).strip("\n")
        if kind == "markdown":
            body = "\n".join(l[2:] if l.startswith("# ") else l.lstrip("#") for l in body.splitlines())
            cells.append(nbformat.v4.new_markdown_cell(body))
        else:
            cell = nbformat.v4.new_code_cell(body)
            if tags:
                cell.metadata["tags"] = tags
            cells.append(cell)

    for line in text.splitlines():
        if line.startswith("# %%"):
            flush()
            rest = line[4:].strip()
            kind = "markdown" if rest.startswith("[markdown]") else "code"
            tags = rest.split("tags=", 1)[1].split(",") if "tags=" in rest else []
            lines = []
        else:
            lines.append(line)
    flush()
    nb.cells = cells
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i}"
    return nb


if __name__ == "__main__":
    src, dst = sys.argv[1], sys.argv[2]
    nbformat.write(parse(open(src).read()), dst)
