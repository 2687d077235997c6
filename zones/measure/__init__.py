"""Forward passes that measure a model: removing blocks and sublayers, scoring losses on windows.

* ``bootstrap``: the paired bootstrap (over eval windows, examples or blocks) behind every interval;
* ``blocks``: removing blocks, re-running a model from the middle (``BlockTrace``);
* ``scoring``: the one loss routine and the prefix-tree scorer of many removal sets;
* ``ablation``: ΔLoss of removing each block; ``agreement``: KL and top-1 agreement;
* ``sublayer_removal``: removing attention or MLP sublayers, and their parameter counts.
* ``tasks``: zero-shot tasks through lm-evaluation-harness, and zones' offline tasks.
"""
