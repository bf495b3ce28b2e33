"""How many tokens a training step processes per example of the data set, padding included.

A step costs the tokens it processes, pad tokens too, while a run's length is set by the data set's own
tokens. How far the two differ depends on how batches get their length (``Recipe.padding``):

- ``packed``: samples are concatenated into rows of ``seq_len``; a step processes data tokens only.
- ``max-length``: every sample is padded (or truncated) to ``seq_len``.
- ``longest``: each micro-batch is padded to its longest sample (transformers' DataCollatorWithPadding
  with padding=True; torchtune's padded_collate_sft; litgpt's SFT collate), so a step processes
  ``micro_batch_size`` x the expected longest of that many samples. At micro-batch 1 nothing is padded.

The expected longest sample needs the distribution of sample lengths. A checked data set gives its
percentiles (``data.p50_tokens_per_example`` ... ``max_tokens_per_example``), and the CDF is taken as
linear between them. Otherwise a plan gives at most their mean (``data.avg_tokens_per_example``) and the
cap (``seq_len``), so we take the distribution of largest
entropy with that mean on [0, seq_len] (Jaynes 1957, "Information Theory and Statistical Mechanics",
Phys. Rev. 106: with only the mean of a bounded positive quantity known, the least-committal density is
exponential in the value, here truncated at the cap; its rate follows from the mean). Its expected
maximum of B draws is the integral of 1 - F(x)^B over [0, seq_len]. A data set whose samples are sorted
or bucketed by length before batching pads less than this; ``padding: packed`` or ``max-length`` says
so explicitly.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from functools import lru_cache

from services.estimator.plan import Plan
from services.estimator.recipe import Recipe

# Points of the composite Simpson rule over [0, seq_len] for the expected maximum (even; the integrand
# is smooth and monotone, so the rule's error is far below a token at every length).
_SIMPSON_POINTS = 256
_BISECTION_STEPS = 80


def _truncated_exponential_mean(rate: float, cap: float) -> float:
    """Mean of the density proportional to exp(-rate * x) on [0, cap] (rate 0: the uniform, cap / 2)."""
    z = rate * cap
    if abs(z) < 1e-9:
        return cap / 2.0
    # 1/rate - cap / (exp(rate * cap) - 1), written to stay finite for large |rate * cap|.
    if z > 0:
        return 1.0 / rate - cap * math.exp(-z) / -math.expm1(-z)
    return 1.0 / rate + cap / -math.expm1(z)


def _rate_for_mean(mean: float, cap: float) -> float:
    """The truncated exponential's rate whose mean on [0, cap] is ``mean`` (0 < mean < cap); the mean
    falls monotonically with the rate, from cap at -inf through cap / 2 at 0 to 0 at +inf."""
    lo, hi = -1.0, 1.0
    while _truncated_exponential_mean(hi / cap, cap) > mean:
        hi *= 2.0
    while _truncated_exponential_mean(lo / cap, cap) < mean:
        lo *= 2.0
    for _ in range(_BISECTION_STEPS):
        mid = (lo + hi) / 2.0
        if _truncated_exponential_mean(mid / cap, cap) > mean:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0 / cap


@lru_cache(maxsize=1024)
def expected_longest(mean: float, cap: int, batch: int) -> float:
    """Expected length of the longest of ``batch`` samples whose lengths have the largest-entropy
    distribution on [0, cap] with mean ``mean`` (a mean at or above the cap: every sample is cut to it)."""
    if batch <= 1:
        return min(mean, float(cap))
    if mean >= cap:
        return float(cap)
    rate = _rate_for_mean(mean, cap)
    length = float(cap)
    if abs(rate * length) < 1e-9:  # the uniform distribution: E[max] = cap * B / (B + 1)
        return length * batch / (batch + 1)
    if rate > 0:
        # F(x) = (1 - e^-rx) / (1 - e^-rL). Beyond (ln B + 40) / r the integrand 1 - F^B is below B e^-40.
        upper = min(length, (math.log(batch) + 40.0) / rate)
        tail = math.expm1(-rate * length)
        return min(length, _simpson(lambda x: 1.0 - (math.expm1(-rate * x) / tail) ** batch, 0.0, upper))
    # A negative rate (mean above cap / 2): F(x) = e^{m(x - L)} (1 - e^-mx) / (1 - e^-mL) with m = -rate, so
    # E[max] = L - integral of F^B, and F^B is below e^-40 more than 40 / (B m) under the cap.
    m = -rate
    lower = max(0.0, length - 40.0 / (batch * m))

    def cdf(x: float) -> float:
        return math.exp(m * (x - length)) * math.expm1(-m * x) / math.expm1(-m * length)

    return max(0.0, length - _simpson(lambda x: cdf(x) ** batch, lower, length))


def _simpson(f: Callable[[float], float], a: float, b: float) -> float:
    """Composite Simpson rule of ``f`` over [a, b]."""
    step = (b - a) / _SIMPSON_POINTS
    total = 0.0
    for i in range(_SIMPSON_POINTS + 1):
        weight = 1 if i in (0, _SIMPSON_POINTS) else (4 if i % 2 else 2)
        total += weight * f(a + i * step)
    return total * step / 3.0


@lru_cache(maxsize=1024)
def expected_longest_from_percentiles(points: tuple[tuple[float, int], ...], cap: int, batch: int) -> float:
    """Expected longest of ``batch`` samples (each cut to ``cap``) whose length distribution has the given
    ((share, tokens), ...) percentiles, the last being the maximum (share 1): the CDF linear between them
    and from 0 tokens to the first, so E[max] is the integral of 1 - F(x)^B up to the cap or the maximum."""
    knots = [(0.0, 0.0), *((float(tokens), share) for share, tokens in points)]
    end = min(float(cap), knots[-1][0])
    total = 0.0
    for (x0, f0), (x1, f1) in itertools.pairwise(knots):
        if x1 <= x0 or x0 >= end:
            continue
        total += _simpson(_linear_segment_tail(x0, f0, (f1 - f0) / (x1 - x0), batch), x0, min(x1, end))
    return total


def _linear_segment_tail(x0: float, f0: float, slope: float, batch: int) -> Callable[[float], float]:
    """x -> 1 - F(x)^B on one segment where the CDF rises linearly from f0 at x0."""
    return lambda x: 1.0 - (f0 + slope * (x - x0)) ** batch


def mean_example_tokens(plan: Plan) -> float | None:
    """The data set's mean tokens per example, where the plan gives it."""
    data = plan.data
    if data is None or data.avg_tokens_per_example is None:
        return None
    return float(data.avg_tokens_per_example)


def processed_tokens_per_example(plan: Plan, recipe: Recipe) -> float | None:
    """Tokens a training step processes per example, pad tokens included (None: the plan gives no mean
    example length, so the data set is taken as filling its rows)."""
    mean = mean_example_tokens(plan)
    if mean is None or not plan.is_training:
        return None
    if recipe.padding == "packed":
        return mean
    if recipe.padding == "max-length":
        return float(plan.seq_len)
    percentiles = plan.data.length_percentiles() if plan.data is not None else None
    if percentiles is not None:
        return expected_longest_from_percentiles(percentiles, plan.seq_len, plan.micro_batch_size)
    return expected_longest(round(mean, 3), plan.seq_len, plan.micro_batch_size)


def pads_to_longest_of_known_mean(plan: Plan, recipe: Recipe) -> bool:
    """Whether a micro-batch's rows depend on its size: padding to the longest sample of a data set whose
    mean example length the plan gives (more samples per micro-batch, a longer longest one)."""
    return recipe.padding == "longest" and plan.is_training and mean_example_tokens(plan) is not None


def batch_row_tokens(plan: Plan, recipe: Recipe) -> float:
    """Length of one row of a training micro-batch: ``seq_len``, or under padding to the longest sample
    the expected longest sample of the micro-batch when the data set's mean length is known."""
    if recipe.padding != "longest":
        return float(plan.seq_len)
    processed = processed_tokens_per_example(plan, recipe)
    return float(plan.seq_len) if processed is None else max(1.0, processed)


def data_tokens_per_processed_token(plan: Plan, recipe: Recipe) -> float:
    """Tokens of the data set a step consumes per token it processes: 1 for packed rows or an unknown
    mean length, the mean over the padded length otherwise (a truncated sample's cut tail counts as
    consumed, so a mean above ``seq_len`` gives more than 1)."""
    mean = mean_example_tokens(plan)
    if mean is None:
        return 1.0
    processed = processed_tokens_per_example(plan, recipe)
    if processed is None or processed <= 0:
        return 1.0
    return mean / processed


def run_samples(plan: Plan, recipe: Recipe) -> float | None:
    """Samples (rows) the run trains on over all its epochs: its examples, or where rows are packed or only a token
    count is given, its tokens in rows of seq_len (None: not a training run with a data set)."""
    data = plan.data
    if data is None or not plan.is_training:
        return None
    if data.examples is not None and recipe.padding != "packed":
        return data.examples * data.epochs
    return data.total_tokens() / plan.seq_len


def short_run_warnings(plan: Plan, recipe: Recipe, effective_batch: int) -> list[str]:
    """Where the run's samples (``run_samples``) are fewer than one optimizer step of ``effective_batch``, that it
    makes no full step, in words (one warning; none otherwise)."""
    samples = run_samples(plan, recipe)
    if samples is None or samples >= effective_batch:
        return []
    shown = f"{samples:,.0f}" if samples >= 1 else f"{samples:.2g}"
    return [
        f"the run trains {shown} samples in all, fewer than one optimizer step of {effective_batch:,}: "
        "it never makes a full step (a smaller effective batch, fewer GPUs, or more data)"
    ]


def truncation_note(plan: Plan, recipe: Recipe) -> str | None:
    """Where the data set's mean example is as long as seq_len or longer (rows not packed), that longer examples are
    cut to it, in words; None otherwise."""
    mean = mean_example_tokens(plan)
    processed = processed_tokens_per_example(plan, recipe)
    if mean is None or processed is None or recipe.padding == "packed" or mean < plan.seq_len:
        return None
    return (
        f"padding: the data set's mean example ({mean:,.0f} tokens) is "
        f"{'as long as' if round(mean) == plan.seq_len else 'longer than'} seq_len {plan.seq_len}, so longer "
        f"examples are cut to it and the time counts {processed:,.0f} tokens per example"
    )


def padding_note(plan: Plan, recipe: Recipe) -> str | None:
    """What padding costs the run, in words, where the plan gives the data set's mean example length."""
    mean = mean_example_tokens(plan)
    processed = processed_tokens_per_example(plan, recipe)
    if mean is None or processed is None or recipe.padding == "packed":
        return None
    if mean >= plan.seq_len:
        return truncation_note(plan, recipe)
    share = mean / processed
    if recipe.padding == "max-length":
        how = f"every sample padded to seq_len {plan.seq_len}"
    elif plan.micro_batch_size == 1:
        return None  # one sample per micro-batch: nothing to pad
    else:
        known = plan.data is not None and plan.data.length_percentiles() is not None
        basis = (
            "from the data set's length percentiles"
            if known
            else f"largest-entropy length distribution under seq_len {plan.seq_len}"
        )
        how = (
            f"each micro-batch padded to its longest sample: expected {processed:,.0f} tokens per row for a "
            f"mean of {mean:,.0f} ({basis}; bucketing samples by length pads less)"
        )
    return (
        f"padding: {how}; data tokens are {share:.0%} of the tokens processed, and the time and cost count "
        "the padding (padding 'packed' avoids it)"
    )


def padding_shows(processed_tokens_per_s: float, data_tokens_per_s: float) -> bool:
    """Whether padding costs enough (0.5%) to show the data rate beside the processed one."""
    return data_tokens_per_s < processed_tokens_per_s * 0.995
