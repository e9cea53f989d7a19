"""McNemar's test of two methods' correctness on the same items (exact binomial form), with the paired
difference in accuracy and its 95% Wald interval.

b = items only method 1 gets right, c = items only method 2 gets right. Under "same accuracy", b ~ Binomial(b +
c, 1/2): p = min(1, 2 P(X <= min(b, c))). Accuracy difference d = (b - c) / n with standard error
sqrt(b + c - (b - c)^2 / n) / n.
"""

import math

import datasets
import evaluate
from scipy.stats import binom

_DESCRIPTION = "Exact McNemar test of two methods' correctness on the same items, and the accuracy difference."
_KWARGS = """
Args:
    predictions1 (`list[int]`): 1 where method 1 is correct, else 0.
    predictions2 (`list[int]`): the same items for method 2.
Returns:
    accuracy1, accuracy2 (`float`); difference (`float`): accuracy1 - accuracy2; difference_ci (`list[float]`):
    its 95% interval; discordant (`list[int]`): [b, c]; p_value (`float`): exact two-sided McNemar p-value.
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS)
class McNemar(evaluate.Comparison):
    def _info(self):
        return evaluate.ComparisonInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS,
            features=datasets.Features({"predictions1": datasets.Value("int64"), "predictions2": datasets.Value("int64")}),
        )

    def _compute(self, predictions1, predictions2):
        n = len(predictions1)
        b = sum(1 for x, y in zip(predictions1, predictions2) if x and not y)
        c = sum(1 for x, y in zip(predictions1, predictions2) if y and not x)
        p = 1.0 if b + c == 0 else min(1.0, 2 * float(binom.cdf(min(b, c), b + c, 0.5)))
        difference = (b - c) / max(1, n)
        se = math.sqrt(max(0.0, b + c - (b - c) ** 2 / max(1, n))) / max(1, n)
        return {
            "accuracy1": sum(predictions1) / max(1, n),
            "accuracy2": sum(predictions2) / max(1, n),
            "difference": difference,
            "difference_ci": [difference - 1.96 * se, difference + 1.96 * se],
            "discordant": [b, c],
            "p_value": p,
        }
