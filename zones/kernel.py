"""One notebook kernel for a build's chapters: started once, made fresh between chapters.

A kernel costs seconds before a chapter's first line runs (its start, then torch,
transformers, scipy and altair imported), about 4 s a chapter on 2 cores: 14 chapters pay
it 14 times. ``zones book`` runs its chapters in one :class:`ChapterKernel` instead, and
between chapters puts back what a fresh kernel would have:

* the user namespace is cleared (``%reset -f``), so a chapter cannot read a name another left;
* the environment is the one the kernel started with, plus the chapter's (book mode, quiet
  bars, its progress file): a variable a chapter set does not reach the next;
* the working folder is the chapter's;
* the work counted so far (``zones.core.progress``) starts again at 0 and is written out at
  the chapter's end, as a kernel's exit would;
* torch's, numpy's and Python's global random states are those a fresh kernel starts with
  (torch's is fixed; numpy's and Python's are drawn again), so a chapter that draws without a
  seed gets what it would get alone.

Imported modules stay imported: that is the saving. A chapter that fails leaves a kernel that
cannot be trusted, so the next chapter gets a new one (:meth:`ChapterKernel.restart`).
"""
from __future__ import annotations

import os
import queue
import sys
import tempfile
from pathlib import Path

from jupyter_client.blocking import BlockingKernelClient
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.utils import run_sync

KERNEL_NAME = "python3"


def fresh_state(environment: dict[str, str], folder: str) -> None:
    """Run inside the kernel before a chapter: the environment the kernel started with plus
    ``environment``, ``folder`` as the working folder, no counted work, and the global random
    states of a new process."""
    import random

    import numpy as np
    import torch

    os.environ.clear()
    os.environ.update({**_FRESH["environment"], **environment})
    os.chdir(folder)
    from zones.core import progress

    progress.restart()
    random.seed()                                  # a new process seeds from the OS
    np.random.seed()
    torch.set_rng_state(_FRESH["torch"])


def remember_fresh() -> None:
    """Run once in a new kernel: keep its environment and torch's random state as a new process has them."""
    import torch

    _FRESH.update(environment=dict(os.environ), torch=torch.get_rng_state())


_FRESH: dict = {}


class _Manager(AsyncKernelManager):
    """A kernel manager that hands out its clients on its own zmq context and keeps them, so
    they can be closed after each chapter: nbclient leaves the client of a kernel it does not own
    open (its sockets and heartbeat thread, about 12 descriptors), and a build runs ~40 of them."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.clients: list = []

    def client(self, **kwargs):
        kwargs.setdefault("context", self.context)
        client = super().client(**kwargs)
        self.clients.append(client)
        return client

    def close_clients(self) -> None:
        while self.clients:
            self.clients.pop().stop_channels()

    def shell_client(self):
        """One client on the shell channel only, kept for the kernel's life (:meth:`ChapterKernel._run`)."""
        if getattr(self, "_shell", None) is None:   # a blocking client: no event loop to share with papermill's
            self._shell = BlockingKernelClient()
            self._shell.load_connection_info(self.get_connection_info())
            self._shell.start_channels(shell=True, iopub=False, stdin=False, hb=False, control=False)
        return self._shell

    def close_shell_client(self) -> None:
        if getattr(self, "_shell", None) is not None:
            self._shell.stop_channels()
            self._shell = None


class ChapterKernel:
    """A Python kernel that executes chapter after chapter (``with ChapterKernel() as kernel``;
    ``kernel.manager`` goes to papermill as ``km``). :meth:`prepare` before each chapter,
    :meth:`finish` after it."""

    def __init__(self, kernel_name: str = KERNEL_NAME):
        self.kernel_name = kernel_name
        self.manager: AsyncKernelManager | None = None

    def __enter__(self) -> "ChapterKernel":
        self.restart()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def restart(self) -> None:
        """A new kernel (the old one, if any, shut down), its fresh state remembered."""
        self.close()
        self.manager = _Manager(kernel_name=self.kernel_name)
        # started as nbclient starts a kernel it is handed (IPython's history kept in memory only)
        run_sync(self.manager.start_kernel)(extra_arguments=["--HistoryManager.hist_file=:memory:"])
        self._run("from zones.kernel import remember_fresh\nremember_fresh()")

    def close(self) -> None:
        if self.manager is not None:
            self.manager.close_clients()
            self.manager.close_shell_client()
            if self.manager.has_kernel:
                run_sync(self.manager.shutdown_kernel)(now=True)
        self.manager = None

    def prepare(self, environment: dict[str, str], folder: str | os.PathLike) -> None:
        """Before a chapter: a clear namespace, ``environment``, ``folder``, fresh random states."""
        self._run("get_ipython().run_line_magic('reset', '-f')\n"
                  "from zones.kernel import fresh_state\n"
                  f"fresh_state({dict(environment)!r}, {str(Path(folder).resolve())!r})\n"
                  "del fresh_state")

    def reference_forward_seconds(self, repeats: int = 2) -> float | None:
        """``zones.book.timing.reference_forward_seconds`` timed in this kernel, the process the chapters
        run in: the same forward runs a few per cent faster or slower from one process to another
        (five fresh processes: 2.28-2.51 s), so the unit of a chapter's overhead is timed where its
        work ran. None when it could not be timed."""
        with tempfile.TemporaryDirectory(prefix="zones-unit-") as folder:
            out = Path(folder) / "seconds"
            try:
                self._run("from zones.book.timing import reference_forward_seconds as _unit\n"
                          f"with open({str(out)!r}, 'w') as _out:\n    _out.write(repr(_unit(repeats={int(repeats)})))\n"
                          "del _unit, _out")
            except Exception as err:  # noqa: BLE001 - the unit is a courtesy: never stop a build over it
                print(f"zones book: no reference forward in the kernel ({err})", file=sys.stderr)
            text = out.read_text().strip() if out.exists() else "None"
        return None if text == "None" else float(text)

    def finish(self) -> None:
        """After a chapter: its counted work written to its progress file, as an exit would."""
        self._run("from zones.core.progress import flush as _flush\n_flush()\ndel _flush")

    def _run(self, code: str) -> None:
        """Run ``code`` in the kernel (a ``KernelCodeError`` if it raises); then close every client
        opened since (the chapter's too). Sent on one kept shell-only client: a NotebookClient per
        call starts its channels and waits for the kernel, ~0.2 s, and a chapter makes two calls."""
        try:
            self._execute(code)
        finally:
            self.manager.close_clients()

    def _execute(self, code: str) -> None:
        client = self.manager.shell_client()
        msg_id = client.execute(code, store_history=False, allow_stdin=False)
        while True:
            try:
                reply = client.get_shell_msg(timeout=1)
            except queue.Empty:
                if not run_sync(self.manager.is_alive)():
                    raise KernelCodeError("the chapters' kernel died") from None
                continue
            if reply.get("parent_header", {}).get("msg_id") == msg_id:
                break
        content = reply["content"]
        if content.get("status") != "ok":
            raise KernelCodeError(f"{content.get('ename')}: {content.get('evalue')}")


class KernelCodeError(RuntimeError):
    """Code run by :meth:`ChapterKernel._run` raised, or the kernel died."""


__all__ = ["ChapterKernel", "KernelCodeError", "fresh_state", "remember_fresh"]
