"""Orbax checkpoints of the training state: periodic, keep-last-N, resume from the latest.

Orbax writes each step to a temporary folder and renames it when complete, so a run killed at
any moment resumes from the latest complete step. The state is saved as its list of leaves and
restored into the structure of a freshly initialised state (same settings, same tree).
"""
from __future__ import annotations

import errno
import shutil
from pathlib import Path

import jax
import orbax.checkpoint as ocp


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
        (which orbax reports as a ValueError of TensorStore's) is the OSError it is."""
        leaves = jax.tree.leaves(state)
        try:
            self.manager.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(leaves), meta=ocp.args.JsonSave({"step": int(step), "leaves": len(leaves)})))
            self.manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001 - any failed save: its scratch goes, then the error propagates
            for partial in self.folder.glob(f"{int(step)}.orbax-checkpoint-tmp*"):
                shutil.rmtree(partial, ignore_errors=True)
            if f"os_error_code='{errno.ENOSPC}'" in str(e) or "No space left on device" in str(e):
                raise OSError(errno.ENOSPC, f"No space left on device for checkpoint {step}", str(self.folder)) from None
            raise

    def restore(self, step: int, like):
        """The state saved at `step`, in the tree structure (and shardings) of `like`."""
        leaves, treedef = jax.tree.flatten(like)
        meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        if meta["leaves"] != len(leaves):
            raise ValueError(f"checkpoint {self.folder}/{step} holds {meta['leaves']} arrays but this run's state has "
                             f"{len(leaves)}: it was written with other model settings; use a fresh --out")
        abstract = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding) for x in leaves]
        restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
        return jax.tree.unflatten(treedef, list(restored["state"]))

    def close(self) -> None:
        self.manager.close()
