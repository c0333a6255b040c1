"""The server over several JAX processes (`python -m dart_jax.launch ... -- python -m dart_jax.serve`).

Process 0 serves HTTP and owns the queue of requests; every process runs the same scheduler loop
over the same pools, so that each jitted step runs in all of them (the multi-controller pattern).
Once per turn of the loop process 0 hands what its clients asked since the last turn (new jobs,
cancellations, a shutdown) to the others (`share`); each process applies the same operations in
the same order and then steps the same pools. Only process 0's jobs have sinks; the others'
events go nowhere.
"""
from __future__ import annotations

import dataclasses
import json
import queue

import jax

from dart_jax.decoding.settings import GenerationSettings
from dart_jax.models.multihost import share

from .scheduler import Job, Scheduler


class SharedScheduler(Scheduler):
    """A `Scheduler` whose loop runs in every process: in process 0 on its thread (`start`), in
    the others through `follow`, which returns when process 0's scheduler stops."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.leader = jax.process_index() == 0
        # every process steps the same pools: the warm-up's programs compile in its requests' steps, in
        # every process, and it ends before the server serves (no admission that one process alone decides)
        self.background_warmup = self.compiles_ahead = False
        self._known: dict[int, Job] = {}  # jobs by id, until they finish

    def follow(self) -> None:
        """The loop of a process other than 0 (blocks until process 0 stops)."""
        self._loop()
        if self.failure is not None:  # this process cannot follow process 0's steps any more
            raise RuntimeError(f"the scheduler of process {jax.process_index()} stopped: {self.failure}")

    def _turn(self) -> bool:
        """One turn in every process: process 0's operations of the turn applied alike, then the
        same pools stepped; False once process 0 stops."""
        ops, stop = self._exchange(block=not any(p.active for p in self._pools.values()))
        for op in ops:
            self._apply(op)
        if stop:
            return False
        self._step_pools()
        self._known = {i: job for i, job in self._known.items() if not job.done}
        return True

    def _exchange(self, block: bool) -> tuple[list[tuple], bool]:
        """What process 0's clients asked since the last turn, as plain operations, in every process."""
        if not self.leader:
            return _decode(share(None))
        items = []
        try:
            items.append(self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait())
            while True:
                items.append(self._inbox.get_nowait())
        except queue.Empty:
            pass
        ops = []
        for kind, item in items:
            if kind == "submit":
                self._known[item.id] = item
                ops.append(("submit", item.id, item.method, [int(t) for t in item.prompt_ids],
                            dataclasses.asdict(item.settings), item.tree_size, item.stop_at_eos))
            elif kind == "cancel":
                ops.append(("cancel", item.id))
            elif kind == "interrupt":
                ops.append(("interrupt", item))
        message = (ops, self._stop.is_set())
        shared = json.dumps(message).encode()  # plain JSON between processes: nothing is unpickled
        share(shared)
        return _decode(shared)

    def _apply(self, op: tuple) -> None:
        kind, *rest = op
        if kind == "submit":
            job_id, method, prompt_ids, settings, tree_size, stop_at_eos = rest
            job = self._known.get(job_id)
            if job is None:  # a follower's copy of process 0's job (a warm-up's decodes past EOS there too)
                job = self._known[job_id] = Job(job_id, method, prompt_ids, settings, tree_size, lambda event: None,
                                                stop_at_eos=stop_at_eos)
            self._admit(job)
        elif kind == "cancel":
            job = self._known.get(rest[0])
            if job is not None:
                self._cancel(job)
        elif kind == "interrupt":
            self._fail_all(rest[0], reason="shutdown")


def _decode(payload: bytes) -> tuple[list[tuple], bool]:
    """A turn's operations as `_exchange` sent them (JSON: lists for tuples, settings as a dict)."""
    ops, stop = json.loads(payload.decode())
    out = []
    for op in ops:
        if op[0] == "submit":
            op = [*op[:4], GenerationSettings(**op[4]), *op[5:]]
        out.append(tuple(op))
    return out, bool(stop)
