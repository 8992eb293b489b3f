"""Execution diagnostics: how far the trainer and the sampler are apart."""

from minite.diagnostics.metrics import (
    MISMATCH_METRIC_NAMES,
    full_vocab_metrics,
    mismatch_metrics,
    routing_topk_agreement,
)

__all__ = [
    "MISMATCH_METRIC_NAMES",
    "full_vocab_metrics",
    "mismatch_metrics",
    "routing_topk_agreement",
]
