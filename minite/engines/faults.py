"""Non-finite values in a training step: detect them where they appear, name the place, and let the
loop skip the step or stop (config `on_nonfinite`), never train on them silently.

Detection is cheap on the happy path (one `isfinite` over the log-probs, the loss and each gradient);
only once something is non-finite does `locate_activation` re-run the forward with hooks to name the
first module whose output went non-finite.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class NonFiniteError(FloatingPointError):
    """A step produced NaN/Inf; `event` says what (activation / loss / gradient / reward) and where."""

    def __init__(self, event: dict[str, Any]) -> None:
        self.event = event
        where = event.get("site") or ", ".join(event.get("params", [])[:3]) or event.get("tensor", "?")
        super().__init__(f"non-finite {event['kind']} at {where}")


def nonfinite_grads(model: nn.Module) -> list[str]:
    return [
        n
        for n, p in model.named_parameters()
        if p.grad is not None and not bool(torch.isfinite(p.grad).all())
    ]


def nonfinite_params(model: nn.Module) -> list[str]:
    return [n for n, p in model.named_parameters() if not bool(torch.isfinite(p).all())]


@torch.no_grad()
def locate_activation(model: nn.Module, run_forward) -> str | None:
    """Name of the first module (in execution order) whose output holds NaN/Inf during `run_forward()`."""
    order: list[str] = []
    handles = []

    def hook(name):
        def fn(_m, _i, out):
            t = out[0] if isinstance(out, tuple | list) else out
            if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
                order.append(name)

        return fn

    for name, mod in model.named_modules():
        if name and not list(mod.children()):  # leaves: the innermost module is the culprit
            handles.append(mod.register_forward_hook(hook(name)))
    for name, mod in model.named_modules():
        if name and list(mod.children()) and name.count(".") <= 3:
            handles.append(mod.register_forward_hook(hook(name)))
    try:
        run_forward()
    finally:
        for h in handles:
            h.remove()
    return order[0] if order else None
