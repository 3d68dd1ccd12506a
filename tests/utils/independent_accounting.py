"""Privacy accounting built from scratch, to check the accountants the package calls against."""

import math

import numpy as np
from scipy.stats import norm


def independent_replace_one_epsilon(sigma: float, q: float, steps: int, delta: float) -> float:
    """ε of ``steps`` compositions of the replace-one pair P = (1−q)N(0,σ²)+qN(1,σ²),
    Q = (1−q)N(0,σ²)+qN(−1,σ²).

    Built here from scratch: the privacy loss L(x) = log P(x)/Q(x) on a fine x grid, its law under P
    histogrammed on a loss grid (rounded up: pessimistic), composed by FFT, and δ(ε) = E_P[(1 − e^{ε−L})₊]
    inverted by bisection. The pair is symmetric (x → −x swaps P and Q), so one direction suffices."""
    x = np.linspace(-12 * sigma - 2, 12 * sigma + 2, 100_001)
    dx = x[1] - x[0]
    p = (1 - q) * norm.pdf(x, 0, sigma) + q * norm.pdf(x, 1, sigma)
    loss = (np.logaddexp(np.log1p(-q) + norm.logpdf(x, 0, sigma), np.log(q) + norm.logpdf(x, 1, sigma))
            - np.logaddexp(np.log1p(-q) + norm.logpdf(x, 0, sigma), np.log(q) + norm.logpdf(x, -1, sigma)))
    width = 5e-4
    low = math.floor(loss.min() / width)
    bins = np.ceil(loss / width).astype(np.int64) - low
    pmf = np.bincount(bins, weights=p * dx)
    size = 1 << math.ceil(math.log2(steps * len(pmf)))
    composed = np.fft.irfft(np.fft.rfft(pmf, size) ** steps, size)[: steps * (len(pmf) - 1) + 1]
    composed = np.clip(composed, 0, None)
    values = (np.arange(len(composed)) + steps * low) * width

    def delta_at(eps: float) -> float:
        above = values > eps
        return float(np.sum(composed[above] * -np.expm1(eps - values[above])))

    lo, hi = 0.0, 100.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if delta_at(mid) > delta else (lo, mid)
    return hi


def gaussian_epsilon(mu: float, delta: float) -> float:
    """ε of the Gaussian mechanism with sensitivity/σ = ``mu`` (any number of compositions folded into μ),
    from its exact privacy profile δ(ε) = Φ(μ/2 − ε/μ) − e^ε·Φ(−μ/2 − ε/μ) (Balle & Wang 2018, Thm. 8),
    inverted by bisection."""

    def delta_at(eps: float) -> float:
        return float(norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu))

    lo, hi = 0.0, 100.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if delta_at(mid) > delta else (lo, mid)
    return hi
