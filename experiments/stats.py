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
  wilson(k, n), newcombe(k1, n1, k2, n2)   score intervals of a collapse rate and of a difference of two
                                 (Newcombe 1998, method 10), for the confirmation (experiments/regime/confirm.py)
  t_cdf, t_quantile, t_interval, pooled_t, noncentral_t_sf   Student's t (integer df, closed form) for the claims
                                 over seeds (experiments/claims.py): intervals, the two-sample test, replication odds
"""
import itertools
import math
import random
import statistics

EXACT_MAX = 200_000
MC_DRAWS = 100_000
# Ties in floating point: a split as extreme as the observed one up to rounding counts as extreme.
# permutation_test takes drawdowns of held-out scores, in [0, 1]: the run records keep 7 significant digits of values
# computed in fp32, so equal drawdowns can differ by ~1e-7, and genuinely different ones by at least one held-out
# sample (1/390 or more), so an absolute 1e-6 tells the two apart.
TOL = 1e-6
# paired_permutation_test takes differences of in-memory metrics (experiments/mismatch/numerics.py) as small as 1e-15,
# so its absolute tolerance stays 1e-9: differences below it (the fp32 oracle's last bits) count as no difference.
# Paired tests of run records (held-out areas, drawdowns: 7 significant digits) pass TOL instead.
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


def paired_permutation_test(diffs: list[float], seed: int = 0, tol: float = PAIRED_TOL) -> float:
    """Two-sided p that paired differences are centred on 0: the fraction of the 2^n sign flips whose |mean| is at
    least the observed one (up to `tol`); exact up to EXACT_MAX flips, else Monte Carlo (MC_DRAWS draws, the
    observed counted)."""
    if not diffs:
        return 1.0
    n, observed = len(diffs), abs(sum(diffs) / len(diffs))
    if 2 ** n <= EXACT_MAX:
        flips = itertools.product((1, -1), repeat=n)
        return sum(abs(sum(s * d for s, d in zip(f, diffs))) / n >= observed - tol for f in flips) / 2 ** n
    rng = random.Random(seed)
    hits = sum(abs(sum(d if rng.random() < 0.5 else -d for d in diffs)) / n >= observed - tol
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
    """The 2.5 and 97.5 % points (nearest rank) of `crossing` over fits to runs resampled with replacement, among the
    draws whose crossing lies in [lo, hi]. The others are counted, not dropped silently: 'passed' (the fitted rate is
    above `level` already at lo: every resampled run collapsed, or the crossing lies below lo) and 'not_reached' (no
    resampled run collapsed, the slope is not positive, or the crossing lies above hi); a draw whose runs all agree
    is not fitted (its slope would be rounding noise of either sign)."""
    rng = random.Random(seed)
    found, n, passed = [], len(xs), 0
    for _ in range(draws):
        idx = [rng.randrange(n) for _ in range(n)]
        ys_b = [ys[i] for i in idx]
        if (k := sum(ys_b)) in (0, n):
            passed += k == n
            continue
        c = crossing(*logistic_fit([xs[i] for i in idx], ys_b), level)
        if c is not None and c < lo:
            passed += 1
        elif c is not None and c <= hi:
            found.append(c)
    found.sort()
    pick = lambda q: found[max(0, math.ceil(q * len(found)) - 1)] if found else None  # noqa: E731
    return dict(lo=pick(0.025), hi=pick(0.975), passed=passed / draws,
                not_reached=1 - (len(found) + passed) / draws, draws=draws, range=[lo, hi])


# ------------------------------------------------------------------------- Student's t, for claims over seeds
# experiments/claims.py: t-intervals over warm-up seeds and the check of a remake on another kind of CPU. Integer
# degrees of freedom only (n - 1, or n1 + n2 - 2 for the pooled two-sample test), where the CDF has a closed form.
def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with integer df >= 1 (Abramowitz & Stegun 26.7.3-4: a finite series in cos θ)."""
    if df < 1 or int(df) != df:
        raise ValueError(f"t_cdf takes an integer df >= 1, not {df}")
    theta = math.atan(abs(t) / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2:  # odd: 2/π (θ + sin θ cos θ (1 + 2/3 c² + 2·4/(3·5) c⁴ + ... up to c^(df-3)))
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        a = 2 / math.pi * (theta + s * math.cos(theta) * total)
    else:  # even: sin θ (1 + 1/2 c² + 1·3/(2·4) c⁴ + ... up to c^(df-2))
        term, total = 1.0, 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        a = s * total
    return 0.5 + math.copysign(a / 2, t)


def t_quantile(p: float, df: int) -> float:
    """The t with t_cdf(t, df) = p (bisection to 1e-12)."""
    if not 0 < p < 1:
        raise ValueError(f"t_quantile takes 0 < p < 1, not {p}")
    lo, hi = -1.0, 1.0
    while t_cdf(lo, df) > p:
        lo *= 2
    while t_cdf(hi, df) < p:
        hi *= 2
    while hi - lo > 1e-12 * max(1.0, abs(lo)):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def mean_sd(xs: list[float]) -> tuple[float, float]:
    """The mean and the sample standard deviation (n - 1; nan for one value)."""
    n = len(xs)
    m = sum(xs) / n
    return m, (math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1)) if n > 1 else float("nan"))


def t_interval(xs: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, lo, hi): the two-sided t-interval of the mean of xs (independent draws, e.g. one per seed)."""
    m, sd = mean_sd(xs)
    half = t_quantile(0.5 + level / 2, len(xs) - 1) * sd / math.sqrt(len(xs))
    return m, m - half, m + half


def pooled_t(m1: float, s1: float, n1: int, m2: float, s2: float, n2: int) -> tuple[float, int]:
    """(t, df) of the two-sample t-test of equal means with a pooled variance, from each sample's mean, sd and n."""
    df = n1 + n2 - 2
    sp = math.sqrt(((n1 - 1) * s1 ** 2 + (n2 - 1) * s2 ** 2) / df)
    se = sp * math.sqrt(1 / n1 + 1 / n2)
    return ((m1 - m2) / se if se > 0 else (0.0 if m1 == m2 else math.copysign(math.inf, m1 - m2))), df


def noncentral_t_sf(c: float, df: int, delta: float, steps: int = 4000) -> float:
    """P(T > c) for the noncentral t with df and noncentrality delta, T = (Z + delta) / sqrt(V / df): the mean over
    the chi distribution of sqrt(V) of P(Z > c sqrt(V / df) - delta), by Simpson's rule (error below 1e-8)."""
    hi = math.sqrt(df) + 12.0
    h = hi / steps
    log_norm = (df / 2 - 1) * math.log(2) + math.lgamma(df / 2)

    def f(u):
        dens = math.exp((df - 1) * math.log(u) - u * u / 2 - log_norm) if u > 0 else (1.0 / math.exp(log_norm)
                                                                                      if df == 1 else 0.0)
        return dens * 0.5 * math.erfc((c * u / math.sqrt(df) - delta) / math.sqrt(2))
    total = f(0.0) + f(hi) + sum((4 if i % 2 else 2) * f(i * h) for i in range(1, steps))
    return min(1.0, max(0.0, total * h / 3))


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjusted p values, in the order given."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    adj, run = [1.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        run = max(run, min(1.0, (len(ps) - rank) * ps[i]))
        adj[i] = run
    return adj


def wilson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson's score interval of a proportion k / n ((0, 1) when n is 0)."""
    if n == 0:
        return 0.0, 1.0
    z = statistics.NormalDist().inv_cdf(0.5 + level / 2)
    p = k / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    lo, hi = (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)
    return (0.0 if k == 0 else max(0.0, lo)), (1.0 if k == n else min(1.0, hi))  # exact at the ends (no rounding)


def newcombe(k1: int, n1: int, k2: int, n2: int, level: float = 0.95) -> tuple[float, float]:
    """Newcombe's hybrid score interval (his method 10) of p1 - p2, from the two Wilson intervals."""
    p1, p2 = k1 / n1, k2 / n2
    (l1, u1), (l2, u2) = wilson(k1, n1, level), wilson(k2, n2, level)
    d = p1 - p2
    return d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
