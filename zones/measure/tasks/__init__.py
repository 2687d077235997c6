"""Zero-shot tasks through lm-evaluation-harness, and zones' own offline tasks.

* ``build``: the offline tasks' data, built deterministically from the held-out (eval) split of
  the book's corpora (``python -m zones.measure.tasks.build`` rewrites the shipped files);
* ``offline_data``: reading the shipped files, checked against their manifest (lm-eval's
  ``custom_dataset`` of the task YAML files in ``offline/``);
* ``harness``: running tasks on a model through lm-eval's ``HFLM`` (:func:`evaluate_tasks`),
  paired differences between variants over the same examples (:func:`paired_differences`), and
  the check of lm-eval's log-likelihoods against zones' loss (:func:`loglik_agreement`).

lm-eval is an optional dependency (``pip install 'zones[eval]'``): importing this package
does not import it; running a task without it is one :class:`TaskError` line.
"""
from zones.measure.tasks.build import OFFLINE_DIR, TASKS
from zones.measure.tasks.harness import (
    DIFFERENCE_COLUMNS,
    EXAMPLE_COLUMNS,
    METRICS,
    OFFLINE_GROUP,
    OFFLINE_TASKS,
    STANDARD_TASKS,
    TABLE_COLUMNS,
    TaskError,
    TaskResult,
    check_tasks,
    evaluate_tasks,
    hflm,
    loglik_agreement,
    paired_differences,
    task_manager,
    variant_label,
)
from zones.measure.tasks.offline_data import TaskDataError, read_manifest, task_rows

__all__ = ["DIFFERENCE_COLUMNS", "EXAMPLE_COLUMNS", "METRICS", "OFFLINE_DIR", "OFFLINE_GROUP", "OFFLINE_TASKS",
           "STANDARD_TASKS", "TABLE_COLUMNS", "TASKS", "TaskDataError", "TaskError", "TaskResult", "check_tasks",
           "evaluate_tasks", "hflm", "loglik_agreement", "paired_differences", "read_manifest", "task_manager",
           "task_rows", "variant_label"]
