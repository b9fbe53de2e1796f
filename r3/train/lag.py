"""--rollout-lag K: the engine samples step t with the trainer's weights from the start of step t − K, as a K-step
off-policy trainer does (verl's one-step-off-policy trainer, AReaL, slime's async mode sample while the trainer
updates, so the samples come from weights one or more updates old).

`WeightLag` is a FIFO of the last K snapshots of the engine's weights: CPU copies of `engine.model.state_dict()` taken
right after the engine's ordinary sync, so each is cast (and quantised, and router-rounded) exactly as the engine casts
the trainer's weights. After each update `lagged_sync` syncs the engine as usual, pushes that snapshot, and loads
the oldest one back into the engine. The FIFO starts as K references to the engine's initial weights, so the first
K steps sample with the weights of step 0's start. Nothing grows beyond K snapshots; the memory is K copies of the
engine's weights (at rollout precision) in CPU memory, plus K such copies in every ckpt.pt.

A snapshot is never written to once taken (the engine loads it by copying), so keeping a step's start state, for the
collapse guard's `--on-collapse stop`, is a list of references. K = 0 is no FIFO at all: `lagged_sync` is then the
ordinary sync, call for call.

Left out: lag for a server engine (it loads weights from disk each step; a lagged server would need the trainer to
write K folders) and for `--rollouts` (the samples on disk have whatever lag their sampler had).
"""
from collections import deque

import torch

from r3.runs.checkpoint import CheckpointFileError
from r3.runs.validate import check_weight
from r3.scale.fsdp import sync_engine


def snapshot(engine) -> dict[str, torch.Tensor]:
    """The weights the engine samples with, as CPU copies."""
    return {k: v.detach().to("cpu", copy=True) for k, v in engine.model.state_dict().items()}


class WeightLag:
    """The engine's weights of the last K steps' starts, oldest first; `serving` is what the engine holds now.
    Each entry is (step, weights): the step whose start the weights are (the trainer's weights after step − 1)."""

    def __init__(self, k: int, engine, step: int = 0):
        if k < 1:
            raise ValueError(f"WeightLag needs k >= 1, got {k} (k = 0 is the ordinary sync: no FIFO)")
        self.k = k
        self.serving = (step, snapshot(engine))  # the engine's weights now (`step`'s start), K times below
        self.queue = deque([self.serving] * k)

    def push(self, step: int, weights: dict) -> tuple[int, dict]:
        """Add the weights of `step`'s start; return the oldest entry, which the engine now serves."""
        self.queue.append((step, weights))
        self.serving = self.queue.popleft()
        assert len(self.queue) == self.k
        return self.serving

    def lag(self, step: int) -> int:
        """Steps between the weights the engine samples `step` with and the trainer's at `step`'s start."""
        return step - self.serving[0]

    # the collapse guard's step-start copy: references, never copies (a snapshot is never written to)
    def references(self) -> tuple:
        return self.serving, list(self.queue)

    def restore(self, refs: tuple, engine) -> None:
        self.serving, queue = refs
        self.queue = deque(queue)
        engine.model.load_state_dict(self.serving[1])

    # ckpt.pt (extra["rollout_lag"]): plain containers of tensors, for torch.load(weights_only=True)
    def state_dict(self) -> dict:
        return dict(k=self.k, steps=[s for s, _ in self.queue], weights=[w for _, w in self.queue],
                    serving_step=self.serving[0])

    def load_state_dict(self, state, engine, path: str) -> None:
        """Restore the FIFO saved with ckpt.pt at `path`, after the engine's own weights were restored (they are
        `serving`). Raises CheckpointFileError, naming the file, when it holds no FIFO of K entries that fit the
        engine, before changing anything."""
        if not isinstance(state, dict) or state.get("k") != self.k or not isinstance(state.get("weights"), list) \
                or len(state["weights"]) != self.k or len(state.get("steps") or ()) != self.k:
            raise CheckpointFileError(f"checkpoint {path!r} holds no --rollout-lag FIFO of {self.k} snapshots "
                                      f"(extra['rollout_lag']); it cannot resume this run bit for bit")
        want = {k: (tuple(v.shape), v.dtype) for k, v in engine.model.state_dict().items()}
        for i, w in enumerate(state["weights"]):
            have = {k: (tuple(v.shape), v.dtype) for k, v in w.items()} if isinstance(w, dict) else None
            if have != want:
                raise CheckpointFileError(f"checkpoint {path!r}: --rollout-lag snapshot {i} does not fit the engine's "
                                          f"weights (names, shapes or dtypes differ)")
            for k, v in w.items():
                check_weight(v, f"extra.rollout_lag.weights[{i}].{k}", path, CheckpointFileError)
        self.queue = deque(zip((int(s) for s in state["steps"]), state["weights"]))
        self.serving = (int(state["serving_step"]), snapshot(engine))


def resumed_lag(lag: WeightLag | None, saved, *, k: int, changed: bool, model, engine, plain, step: int,
                path: str) -> WeightLag | None:
    """The FIFO of a run resumed at `step` from ckpt.pt at `path` (the engine's weights already restored). A resume
    that changes --rollout-lag (--allow-change rollout_lag) syncs the engine from the trainer and starts a FIFO
    afresh, as at step 0: the next K steps sample with the weights of `step`'s start."""
    if changed:
        sync_engine(model, engine, plain)
        return WeightLag(k, engine, step) if k else None
    if lag is not None:
        lag.load_state_dict(saved, engine, path)
    return lag


def lagged_sync(model, engine, plain, lag: WeightLag | None, step: int) -> None:
    """Weight sync trainer → engine after `step`'s update. Without a lag, the ordinary sync; with one, the engine
    then serves the oldest weights of the FIFO (those of the start of step + 1 − K)."""
    sync_engine(model, engine, plain)
    if lag is not None:
        engine.model.load_state_dict(lag.push(step + 1, snapshot(engine))[1])
