"""Exact match: the share of predictions equal to their references, after stripping surrounding whitespace."""

import datasets
import evaluate

_DESCRIPTION = "Share of predictions that equal their reference string (surrounding whitespace ignored)."
_KWARGS = """
Args:
    predictions (`list[str]`), references (`list[str]`): same length.
Returns:
    exact_match (`float`): matches / items, in [0, 1]; matches (`int`); items (`int`).
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS)
class ExactMatch(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS,
            features=datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
        )

    def _compute(self, predictions, references):
        matches = sum(p.strip() == r.strip() for p, r in zip(predictions, references))
        return {"exact_match": matches / max(1, len(predictions)), "matches": matches, "items": len(predictions)}
