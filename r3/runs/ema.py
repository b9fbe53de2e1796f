"""The reward's running mean (EMA): the one the collapse guard (r3/train/guard.py) watches, and the one the figures
(r3/runs/plots.py) and the experiments' tables show. It sits here, below both, so that plots need not import the
guard."""

EMA_DECAY = 0.9  # the reward running mean the guard watches, and that plots and tables show


def ema_update(prev: float | None, x: float, decay: float = EMA_DECAY) -> float:
    return x if prev is None else decay * prev + (1 - decay) * x


def ema_series(xs, decay: float = EMA_DECAY) -> list[float]:
    """The running mean the guard computes, at every step."""
    out, prev = [], None
    for x in xs:
        prev = ema_update(prev, x, decay)
        out.append(prev)
    return out
