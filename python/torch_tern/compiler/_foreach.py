"""Decompositions that let tern's compiler take optimizers' foreach operators.

PyTorch's optimizers (``foreach=True``, their default on tern) work on lists of
tensors: ``torch._foreach_lerp_(exp_avgs, grads, 0.1)`` and the like. Compiled
(``torch.compile(opt.step, backend="tern")``), AOTAutograd hands the backend
their functional forms, ``aten._foreach_lerp.Scalar`` with a list in and a list
out, which the compiler has no instruction for; they ran eagerly between the
compiled partitions and the compiled step was slower than the eager one.

Here each foreach operator becomes the per-tensor operators it stands for
(``lerp.Scalar`` on each pair), decomposed further by the core ATen table
where the compiler needs it. The compiler then sees a parameter's whole update
(weight decay, both moments, bias corrections, the step) as one chain of
elementwise operators over tensors of one shape and fuses it into one pass
per parameter.

Only operators whose per-tensor form the compiler lowers (or that decompose
into such) are decomposed: a foreach operator left whole runs as one eager
program per list, which beats one eager kernel per tensor.

The optimizers' step counters are often CPU tensors (Dynamo moves them to the
device only for CUDA and XPU parameters); their arithmetic (``beta ** step``)
then stays on the CPU in the graph, per tensor, and its results are read by
the compiled update. ``capturable=True`` keeps the counters on the device.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

__all__ = ["foreach_decompositions"]


def _per_tensor(single: Callable) -> Callable:
    """A foreach operator as `single` applied to each position of its lists
    (an argument that is not a list is passed to every call)."""

    def decomposition(*args, **kwargs):
        lengths = {len(a) for a in args if isinstance(a, (list, tuple))}
        if len(lengths) != 1 or not _on_tern(args):
            return NotImplemented
        (length,) = lengths
        return [single(*[a[i] if isinstance(a, (list, tuple)) else a for a in args], **kwargs)
                for i in range(length)]

    return decomposition


def _add_per_tensor(table: dict, packet, overloads, single: Callable) -> None:
    """table[packet.overload] = single per tensor, for those of `overloads`
    the operator has (not every foreach operator has every form)."""
    for overload in overloads:
        if overload in packet.overloads():
            table[getattr(packet, overload)] = _per_tensor(single)


def _on_tern(args) -> bool:
    """Whether the lists' tensors are tern's: a foreach operator on CPU
    tensors (an optimizer's step counters) stays one operator, not one CPU
    operator per tensor run by the graph's Python code."""
    for a in args:
        if isinstance(a, (list, tuple)):
            return all(isinstance(t, torch.Tensor) and t.device.type == "tern" for t in a)
    return False


def _reciprocal(x: torch.Tensor) -> torch.Tensor:
    aten = torch.ops.aten
    return aten.div.Tensor(aten.full_like.default(x, 1), x)


def _power_of_scalar(base, exponent: torch.Tensor) -> torch.Tensor:
    """base ** exponent for a number base: exp(exponent * ln(base)) where base
    is positive (Adam's bias corrections, beta ** step), else left whole."""
    aten = torch.ops.aten
    if (isinstance(base, (int, float)) and not isinstance(base, bool) and base > 0
            and exponent.is_floating_point()):
        if base == 1:
            return aten.full_like.default(exponent, 1)
        return aten.exp.default(aten.mul.Scalar(exponent, math.log(base)))
    return NotImplemented


def _with_value(single: Callable) -> Callable:
    """addcmul/addcdiv, whose value the foreach forms take by position (one
    number, or one per tensor) and the single-tensor form by keyword."""

    def call(x, a, b, value=1):
        return single(x, a, b, value=value)

    return call


def foreach_decompositions(known: frozenset) -> dict:
    """Decompositions of foreach operators (and the few single-tensor
    operators their decompositions need) into operators the compiler lowers;
    `known` is the compiler's operator table (names like "aten.add.Tensor")."""
    aten = torch.ops.aten

    def lowered(op) -> bool:
        return str(op) in known

    # The single-tensor operators the decompositions below produce that the
    # compiler has no lowering for, written with ones it has.
    table: dict = {}
    if not lowered(aten.reciprocal.default) and lowered(aten.div.Tensor):
        table[aten.reciprocal.default] = _reciprocal
    if not lowered(aten.pow.Scalar) and lowered(aten.exp.default):
        table[aten.pow.Scalar] = _power_of_scalar

    from torch._decomp import core_aten_decompositions

    core = core_aten_decompositions()

    def available(op) -> bool:
        # lerp, addcmul and addcdiv decompose through the core ATen table.
        return lowered(op) or op in table or op in core

    binary = {
        "add": (aten.add.Scalar, aten.add.Tensor),
        "sub": (aten.sub.Scalar, aten.sub.Tensor),
        "mul": (aten.mul.Scalar, aten.mul.Tensor),
        "div": (aten.div.Scalar, aten.div.Tensor),
    }
    for name, (with_number, with_tensor) in binary.items():
        foreach = getattr(aten, f"_foreach_{name}")
        if available(with_number):
            _add_per_tensor(table, foreach, ("Scalar", "ScalarList"), with_number)
        if available(with_tensor):
            _add_per_tensor(table, foreach, ("List", "Tensor"), with_tensor)

    # maximum/minimum and clamp_min/clamp_max are one operation with a number
    # or with tensors.
    for names, with_number, with_tensor in (
            (("maximum", "clamp_min"), aten.clamp_min.default, aten.maximum.default),
            (("minimum", "clamp_max"), aten.clamp_max.default, aten.minimum.default)):
        for name in names:
            foreach = getattr(aten, f"_foreach_{name}")
            if available(with_number):
                _add_per_tensor(table, foreach, ("Scalar", "ScalarList"), with_number)
            if available(with_tensor):
                _add_per_tensor(table, foreach, ("List",), with_tensor)

    unary = {
        "sqrt": aten.sqrt.default, "neg": aten.neg.default, "exp": aten.exp.default,
        "log": aten.log.default, "abs": aten.abs.default, "sigmoid": aten.sigmoid.default,
        "tanh": aten.tanh.default, "sin": aten.sin.default, "cos": aten.cos.default,
        "erf": aten.erf.default, "reciprocal": aten.reciprocal.default,
    }
    for name, single in unary.items():
        if available(single):
            _add_per_tensor(table, getattr(aten, f"_foreach_{name}"), ("default",), single)
    if lowered(aten.full_like.default):
        table[aten._foreach_zero.default] = _per_tensor(
            lambda x: aten.full_like.default(x, 0))

    if available(aten.pow.Tensor_Scalar):
        _add_per_tensor(table, aten._foreach_pow, ("Scalar", "ScalarList"), aten.pow.Tensor_Scalar)
    if available(aten.pow.Scalar):
        _add_per_tensor(table, aten._foreach_pow, ("ScalarAndTensor",), aten.pow.Scalar)

    if available(aten.lerp.Scalar):
        _add_per_tensor(table, aten._foreach_lerp, ("Scalar", "ScalarList"), aten.lerp.Scalar)
    if available(aten.lerp.Tensor):
        _add_per_tensor(table, aten._foreach_lerp, ("List",), aten.lerp.Tensor)
    for name in ("addcmul", "addcdiv"):
        single = getattr(aten, name).default
        if available(single):
            _add_per_tensor(table, getattr(aten, f"_foreach_{name}"), ("Scalar", "ScalarList"),
                            _with_value(single))
    return table
