"""Orbax checkpoints of the training state: periodic, keep-last-N, resume from the latest.

Orbax writes each step to a temporary folder and renames it when complete, so a run killed at
any moment resumes from the latest complete step. The state is saved as its list of leaves and
restored into the structure of a freshly initialised state (same settings, same tree). A step
that does not read back (emptied, truncated files) is moved out of the way, beside the
checkpoint folder, and the one before is used (`restore_latest`).
"""
from __future__ import annotations

import errno
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp

from dart_jax.errors import InputError


# where orbax's worker threads (absl) and its event loop's futures (asyncio) log their failures
_ORBAX_LOGGERS = ("absl", "asyncio")


class _Held(logging.Filter):
    """Holds back every record of the loggers it is added to (re-emitted unless the disk was full)."""

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return False


def _drop_full_disk(record: logging.LogRecord) -> bool:
    """False for a record about a full disk (told once, by the command's error line)."""
    error = record.exc_info[1] if record.exc_info else None
    text = record.getMessage() + (str(error) if error is not None else "")
    return not ((isinstance(error, OSError) and error.errno == errno.ENOSPC) or "No space left on device" in text
                or f"os_error_code={errno.ENOSPC}" in text.replace("'", ""))


def _without_failed_save(hook: Callable) -> Callable:
    """`hook` (a sys.unraisablehook) less what a save that failed on a full disk leaves to report:
    orbax's storage callbacks into its closed event loop, and its abandoned write coroutines,
    which fail when the interpreter finalises them at exit."""
    def quiet(report) -> None:
        code = getattr(report.object, "cr_code", None)
        if not ((isinstance(report.exc_value, RuntimeError) and str(report.exc_value) == "Event loop is closed")
                or (code is not None and "orbax" in code.co_filename)):
            hook(report)
    return quiet


class Checkpoints:
    def __init__(self, folder, keep_last: int):
        if keep_last < 1:
            raise ValueError(f"--keep-last must be >= 1, got {keep_last}")
        self.folder = Path(folder).absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep_last, create=True, enable_async_checkpointing=False)
        self.manager = ocp.CheckpointManager(self.folder, options=options)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state) -> None:
        """Save `state` as step `step`. A failed write leaves no temporary folder behind; a full disk
        (which orbax reports as a ValueError of TensorStore's) is the OSError it is, and nothing
        else: the tracebacks orbax's threads log about it are dropped (any other failure's are kept)."""
        leaves = jax.tree.leaves(state)
        held = _Held()
        for name in _ORBAX_LOGGERS:
            logging.getLogger(name).addFilter(held)
        full = False
        # orbax's storage threads call back into its event loop after a failed write has closed it:
        # "Event loop is closed", reported through sys.unraisablehook
        unraisable, previous_hook = [], sys.unraisablehook
        sys.unraisablehook = unraisable.append
        try:
            self.manager.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(leaves), meta=ocp.args.JsonSave({"step": int(step), "leaves": len(leaves)})))
            self.manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001 - any failed save: its scratch goes, then the error propagates
            for partial in self.folder.glob(f"{int(step)}.orbax-checkpoint-tmp*"):
                shutil.rmtree(partial, ignore_errors=True)
            if f"os_error_code='{errno.ENOSPC}'" in str(e) or "No space left on device" in str(e):
                full = True
                for name in _ORBAX_LOGGERS:  # what orbax's threads and futures still report later, at exit
                    logging.getLogger(name).addFilter(_drop_full_disk)
                raise OSError(errno.ENOSPC, f"No space left on device for checkpoint {step}", str(self.folder)) from None
            raise
        finally:
            for name in _ORBAX_LOGGERS:
                logging.getLogger(name).removeFilter(held)
            sys.unraisablehook = _without_failed_save(previous_hook) if full else previous_hook
            if not full:
                for record in held.records:
                    logging.getLogger(record.name).handle(record)
                for report in unraisable:
                    previous_hook(report)

    def restore(self, step: int, like):
        """The state saved at `step`, in the tree structure (and shardings) of `like`."""
        leaves, treedef = jax.tree.flatten(like)
        meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        if meta["leaves"] != len(leaves):
            raise InputError(f"checkpoint {self.folder}/{step} holds {meta['leaves']} arrays but this run's state has "
                             f"{len(leaves)}: it was written with other model settings; use a fresh --out")
        abstract = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding) for x in leaves]
        restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
        return jax.tree.unflatten(treedef, list(restored["state"]))

    def restore_latest(self, like, *, log: Callable[[str], None], writer: bool = True) -> tuple[int, Any]:
        """(step, state) of the latest checkpoint that reads back, or (0, None) when none does. A
        damaged step is named in a notice (`log`) and moved (by the `writer` process) to
        `ckpt.damaged-STEP` beside the checkpoint folder, where a later save of that step cannot
        meet it; then the step before is tried."""
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                return step, self.restore(step, like)
            except InputError:
                raise
            except Exception as e:  # noqa: BLE001 - orbax reports a damaged step as KeyError, JSONDecodeError, TensorStore's ValueError, ...
                aside = self.folder.with_name(f"{self.folder.name}.damaged-{step}")
                log(f"dart_jax.train: checkpoint {self.folder / str(step)} cannot be read ({type(e).__name__}: "
                    f"{str(e)[:120]}); moved to {aside}, resuming from the one before.")
                if writer:
                    shutil.rmtree(aside, ignore_errors=True)
                    os.rename(self.folder / str(step), aside)
                self.manager.reload()
        return 0, None

    def close(self) -> None:
        self.manager.close()
