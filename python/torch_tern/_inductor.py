"""What inductor (torch.compile's default backend) finds for the tern device.

Inductor generates code per device type, looking up a scheduling and a
wrapper code generator for each device a graph uses. It has none for tern,
and without an entry it fails deep inside code generation with
``KeyError: 'tern'``. Inductor's ``init_backend_registration()`` registers an
out-of-tree device's code generators from its device module (``torch.tern``:
``Scheduling``, ``PythonWrapperCodegen``, ``CppWrapperCodegen``,
``WrapperFxCodegen``); torch_tern gives it the classes below, which raise
``TernInductorUnsupported`` with what to do instead the moment inductor
consults them for a graph on tern (the first thing its compiler does, before
the FX graph cache and before any lowering). Graphs on other devices never
touch them, and nothing here imports inductor: it reads the attributes only
when it runs.

Models on tern compile with ``torch.compile(model, backend="tern")`` (tern's
compiler, torch_tern/compiler/_dynamo.py) or ``backend="aot_eager"`` (tern's
eager kernels run the traced graphs); docs/torch.md, "torch.compile".
"""

from __future__ import annotations

from typing import Any, NoReturn

__all__ = ["MESSAGE", "TernInductorUnsupported"]

MESSAGE = (
    "torch.compile's default backend (inductor) cannot compile graphs on the tern device: "
    "inductor has no code generator for tern. Pass backend=\"tern\" to torch.compile "
    "(tern's own compiler: Dynamo and AOTAutograd trace the model, tern's compiler turns "
    "the graphs into executables), or backend=\"aot_eager\" to run the traced graphs on "
    "tern's eager kernels; or move the model to the CPU to use inductor there."
)


class TernInductorUnsupported(RuntimeError):
    """Raised when inductor is asked to compile a graph whose tensors live on tern."""

    def __init__(self) -> None:
        super().__init__(MESSAGE)


def _refuse() -> NoReturn:
    raise TernInductorUnsupported()


class _Refusing(type):
    """Metaclass of the classes inductor registers for tern: constructing one,
    or reading what inductor asks of the class first (``supports_caching``),
    raises TernInductorUnsupported."""

    def __call__(cls, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse()

    @property
    def supports_caching(cls) -> NoReturn:
        _refuse()


class Scheduling(metaclass=_Refusing):
    """Inductor's kernel scheduling for tern: there is none."""


class PythonWrapperCodegen(metaclass=_Refusing):
    """Inductor's host-side (Python) wrapper code for tern: there is none."""


class CppWrapperCodegen(metaclass=_Refusing):
    """Inductor's host-side C++ wrapper code for tern: there is none."""


class WrapperFxCodegen(metaclass=_Refusing):
    """Inductor's FX wrapper code for tern: there is none."""
