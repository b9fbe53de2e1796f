"""The check of a per-seed measurement on a kind of CPU with no exact reference: the remade seed against the spread
of the committed seeds (a prediction band), for entries whose numbers are one measurement per seed, such as the
regime table's start-of-RL rows (`experiments.reproduce`, check kind "seeds: band").

A warm-up turns a kernel's last bits into other weights, so on another kind of CPU seed 0 is a fresh draw from the
distribution the committed seeds 0-7 sample. Per key (on its scale: log for kl-like positive numbers, linear for
rates), with the committed seeds' mean m and standard deviation s over n seeds, the remade value y passes when

    |y - m| <= t(1 - ALPHA / (2 k), n - 1) * s * sqrt(1 + 1/n)

(a two-sided prediction interval for one new draw; k: the keys the entry tests, Bonferroni, so a new kind of CPU that
draws afresh fails the whole entry by chance with probability <= ALPHA, taking the per-seed values as roughly normal).
Where every committed seed gave the same value (s = 0, e.g. the fp32 oracle's zero flips), the remade value must
equal it. A key with a claimed side (`null`, `side`) whose committed band lies wholly on that side (the docs' claim,
e.g. "R3 cuts the kl": kl / kl_r3 > 1) must also land on that side. Wide by design: it catches a change of the code
(flips gone, kl ten times over), not a CPU's last bits.
"""
import dataclasses
import glob
import json
import math
import os

from experiments.common import fmt
from experiments.stats import mean_sd, t_quantile

ALPHA = 1e-3


@dataclasses.dataclass(frozen=True)
class Key:
    name: str                  # a key of the JSON file, or "a/b": the ratio of two keys
    scale: str = "linear"      # "log" or "linear"
    null: float | None = None  # with `side`: the claim "value `side` null"
    side: str | None = None    # ">" or "<"


@dataclasses.dataclass(frozen=True)
class Band:
    file: str    # the checked file, one seed's (relative to the entry's folder), e.g. "measure/start-lv3-s0.json"
    seeds: str   # glob of the committed per-seed files of the same measurement, that one among them
    keys: tuple  # Key, ...


def value(data: dict, name: str) -> float:
    a, _, b = name.partition("/")
    return data[a] / data[b] if b else data[a]


def _scaled(x: float, scale: str) -> float:
    return (math.log(x) if x > 0 else -math.inf) if scale == "log" else float(x)


def test(committed: list[float], remade: float, key: Key, k: int) -> tuple[bool, str]:
    """(passes, one line of numbers) for one key: the remade value against the committed seeds' band."""
    xs = [_scaled(v, key.scale) for v in committed]
    y = _scaled(remade, key.scale)
    inv = math.exp if key.scale == "log" else float
    if not all(math.isfinite(x) for x in xs) or not math.isfinite(y):
        same = sorted(committed) == [remade] * len(committed)
        return same, f"{key.name}: committed {committed}, remade {remade} (not finite on the {key.scale} scale)"
    m, s = mean_sd(xs)
    half = t_quantile(1 - ALPHA / (2 * k), len(xs) - 1) * s * math.sqrt(1 + 1 / len(xs))
    lo, hi = m - half, m + half
    ok = lo <= y <= hi if s > 0 else y == m
    side_ok, side = True, ""
    if key.side is not None:
        z = _scaled(key.null, key.scale)
        claimed = lo > z if key.side == ">" else hi < z
        if claimed:
            side_ok = y > z if key.side == ">" else y < z
            side = f"; side {key.side} {fmt(key.null)} {'ok' if side_ok else 'FAILS'}"
    line = (f"{key.name}: remade {fmt(remade)}, committed seeds' band [{fmt(inv(lo))}, {fmt(inv(hi))}] "
            f"({len(xs)} seeds, mean {fmt(inv(m))}) {'ok' if ok else 'FAILS'}{side}")
    return ok and side_ok, line


def check(bands: tuple, committed_root: str, remade_root: str) -> tuple[list[str], list[str]]:
    """Every band of an entry: (one report line per key, the failing lines). `committed_root` and `remade_root` are
    the entry's committed folder and the folder its check commands wrote."""
    k = sum(len(b.keys) for b in bands)
    report, bad = [], []
    for b in bands:
        paths = sorted(glob.glob(os.path.join(committed_root, b.seeds)))
        committed = [json.load(open(p)) for p in paths]
        with open(os.path.join(remade_root, b.file)) as f:
            remade = json.load(f)
        if len(committed) < 2:
            bad.append(f"{b.file}: {len(committed)} committed seed file(s) match {b.seeds}; a band needs two or more")
            continue
        for key in b.keys:
            ok, line = test([value(d, key.name) for d in committed], value(remade, key.name), key, k)
            report.append(f"{b.file}: {line}")
            if not ok:
                bad.append(f"{b.file}: {line}")
    return report, bad
