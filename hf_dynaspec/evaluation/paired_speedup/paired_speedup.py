"""Paired speedup of a method over a baseline on the same prompts, with a bootstrap interval and a Wilcoxon
signed-rank test.

speedup = sum(baseline seconds) / sum(method seconds) (the bench's ratio of summed times; both methods emit the
same tokens under greedy decoding). The 95% interval comes from resampling prompts with replacement (paired,
`resamples` times, fixed seed). The p-value is Wilcoxon's signed-rank test of the per-prompt log time ratios
log(baseline / method) against 0 (two-sided).
"""

import datasets
import evaluate
import numpy as np
from scipy.stats import wilcoxon

_DESCRIPTION = "Speedup (ratio of summed times) with a paired bootstrap 95% interval and a Wilcoxon p-value."
_KWARGS = """
Args:
    predictions1 (`list[float]`): seconds of the method, one per prompt.
    predictions2 (`list[float]`): seconds of the baseline on the same prompts.
    resamples (`int`, default 2000), seed (`int`, default 0): the bootstrap.
Returns:
    speedup (`float`); ci (`list[float]`): 95% bootstrap interval; p_value (`float`): Wilcoxon signed-rank;
    prompts (`int`).
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS)
class PairedSpeedup(evaluate.Comparison):
    def _info(self):
        return evaluate.ComparisonInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS,
            features=datasets.Features({"predictions1": datasets.Value("float64"), "predictions2": datasets.Value("float64")}),
        )

    def _compute(self, predictions1, predictions2, resamples=2000, seed=0):
        method, baseline = np.asarray(predictions1, dtype=float), np.asarray(predictions2, dtype=float)
        n = len(method)
        speedup = float(baseline.sum() / method.sum())
        rng = np.random.default_rng(seed)
        picks = rng.integers(0, n, size=(resamples, n))  # (B, n) prompt indices, paired
        boot = baseline[picks].sum(axis=1) / method[picks].sum(axis=1)  # (B,)
        log_ratio = np.log(baseline / method)
        p = 1.0 if n < 2 or not np.any(log_ratio != 0) else float(wilcoxon(log_ratio).pvalue)
        return {"speedup": speedup, "ci": [float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975))],
                "p_value": p, "prompts": n}
