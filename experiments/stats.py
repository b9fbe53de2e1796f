"""Tests over seeds for the pre-registered grids (experiments/staleness/, experiments/length/). Exact, no SciPy.

  fisher_exact(a, n_a, b, n_b)   two-sided p of Fisher's exact test: a of n_a runs collapsed against b of n_b
                                 (the sum of the hypergeometric probabilities no larger than the observed table's,
                                 SciPy's `fisher_exact` convention)
  holm(ps)                       Holm's step-down adjusted p values (a family of tests), in the order given
  paired_permutation_test(diffs)  two-sided p of paired differences (sign flips), experiments/mismatch/numerics.py
  logistic_fit(xs, ys)           (a, b) of a one-variable logistic regression (Newton, a small ridge on b);
                                 crossing(a, b) where it reaches 0.5, bootstrap_crossing its interval over runs
  permutation_test(xs, ys)       two-sided p of the difference in means of two samples: the fraction of the
                                 relabellings of the pooled values whose |mean difference| is at least the
                                 observed one; exact over every split up to EXACT_MAX splits, else Monte Carlo
                                 with a seeded generator (MC_DRAWS draws, the observed split counted)
Both return 1.0 when a side is empty (no evidence either way).
"""
import itertools
import math
import random

EXACT_MAX = 200_000
MC_DRAWS = 100_000
# Ties in floating point: a split as extreme as the observed one up to rounding counts as extreme.
# permutation_test takes drawdowns of held-out scores, in [0, 1]: the run records keep 7 significant digits of values
# computed in fp32, so equal drawdowns can differ by ~1e-7, and genuinely different ones by at least one held-out
# sample (1/390 or more), so an absolute 1e-6 tells the two apart.
TOL = 1e-6
# paired_permutation_test takes differences of in-memory metrics (experiments/mismatch/numerics.py) as small as 1e-15,
# so its absolute tolerance stays 1e-9: differences below it (the fp32 oracle's last bits) count as no difference.
PAIRED_TOL = 1e-9


def fisher_exact(a: int, n_a: int, b: int, n_b: int) -> float:
    if not (0 <= a <= n_a and 0 <= b <= n_b):
        raise ValueError(f"counts out of range: {a}/{n_a} vs {b}/{n_b}")
    if n_a == 0 or n_b == 0:
        return 1.0
    k, n = a + b, n_a + n_b

    def prob(x: int) -> float:
        return math.comb(n_a, x) * math.comb(n_b, k - x) / math.comb(n, k)
    observed = prob(a)
    return min(1.0, sum(p for x in range(max(0, k - n_b), min(k, n_a) + 1)
                        if (p := prob(x)) <= observed * (1 + 1e-7)))


def permutation_test(xs: list[float], ys: list[float], seed: int = 0) -> float:
    if not xs or not ys:
        return 1.0
    pooled, n = list(xs) + list(ys), len(xs)
    total = sum(pooled)
    observed = abs(sum(xs) / n - sum(ys) / len(ys))

    def extreme(first_sum: float) -> bool:
        return abs(first_sum / n - (total - first_sum) / len(ys)) >= observed - TOL

    if math.comb(len(pooled), n) <= EXACT_MAX:
        splits = list(itertools.combinations(range(len(pooled)), n))
        return sum(extreme(sum(pooled[i] for i in s)) for s in splits) / len(splits)
    rng = random.Random(seed)
    hits = sum(extreme(sum(rng.sample(pooled, n))) for _ in range(MC_DRAWS))
    return (hits + 1) / (MC_DRAWS + 1)


def paired_permutation_test(diffs: list[float], seed: int = 0) -> float:
    """Two-sided p that paired differences are centred on 0: the fraction of the 2^n sign flips whose |mean| is at
    least the observed one; exact up to EXACT_MAX flips, else Monte Carlo (MC_DRAWS draws, the observed counted)."""
    if not diffs:
        return 1.0
    n, observed = len(diffs), abs(sum(diffs) / len(diffs))
    if 2 ** n <= EXACT_MAX:
        flips = itertools.product((1, -1), repeat=n)
        return sum(abs(sum(s * d for s, d in zip(f, diffs))) / n >= observed - PAIRED_TOL for f in flips) / 2 ** n
    rng = random.Random(seed)
    hits = sum(abs(sum(d if rng.random() < 0.5 else -d for d in diffs)) / n >= observed - PAIRED_TOL
               for _ in range(MC_DRAWS))
    return (hits + 1) / (MC_DRAWS + 1)


def logistic_fit(xs: list[float], ys: list[int], ridge: float = 1e-4, iters: int = 100) -> tuple[float, float]:
    """(a, b) of P(y = 1 | x) = 1 / (1 + exp(-(a + b x))), by Newton's method with a small ridge on b (so complete
    separation gives a steep finite slope, not a diverging one). xs, ys: one entry per run."""
    a, b = 0.0, 0.0
    for _ in range(iters):
        ga, gb, haa, hab, hbb = 0.0, -ridge * b, 1e-12, 0.0, ridge
        for x, y in zip(xs, ys):
            p = 1 / (1 + math.exp(-max(-500.0, min(500.0, a + b * x))))
            w = p * (1 - p)
            ga, gb = ga + (y - p), gb + (y - p) * x
            haa, hab, hbb = haa + w, hab + w * x, hbb + w * x * x
        det = haa * hbb - hab * hab
        if det <= 0:
            break
        da, db = (hbb * ga - hab * gb) / det, (haa * gb - hab * ga) / det
        a, b = a + da, b + db
        if abs(da) < 1e-10 and abs(db) < 1e-10:
            break
    return a, b


def crossing(a: float, b: float, level: float = 0.5) -> float | None:
    """The x at which a logistic fit (a, b) reaches `level`; None when its slope is not positive."""
    return (math.log(level / (1 - level)) - a) / b if b > 0 else None


def bootstrap_crossing(xs: list[float], ys: list[int], draws: int = 2000, seed: int = 0, level: float = 0.5,
                       lo: float = 0.0, hi: float = 1.0) -> dict:
    """The 2.5 and 97.5 % points of `crossing` over fits to runs resampled with replacement; a draw whose crossing
    is undefined or outside [lo, hi] counts as 'not reached' (its share is reported)."""
    rng = random.Random(seed)
    found, n = [], len(xs)
    for _ in range(draws):
        idx = [rng.randrange(n) for _ in range(n)]
        c = crossing(*logistic_fit([xs[i] for i in idx], [ys[i] for i in idx]), level)
        if c is not None and lo <= c <= hi:
            found.append(c)
    found.sort()
    pick = lambda q: found[min(len(found) - 1, int(q * len(found)))] if found else None  # noqa: E731
    return dict(lo=pick(0.025), hi=pick(0.975), not_reached=1 - len(found) / draws, draws=draws)


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjusted p values, in the order given."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    adj, run = [1.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        run = max(run, min(1.0, (len(ps) - rank) * ps[i]))
        adj[i] = run
    return adj
