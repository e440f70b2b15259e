"""Ahead-of-time compilation of a whole model into one tern executable.

    import torch_tern.compiler
    torch_tern.compiler.export(model, (x,), "model.tern")
    # then, from C:  examples/run_model model.tern x.npy
    # or in this process, on tern tensors:
    model_on_tern = torch_tern.compiler.load("model.tern")
    y = model_on_tern(x.to("tern"))

`export` runs ``torch.export`` on the model, decomposes the result to the core
ATen operator set, turns the graph into tern's compiler graph (parameters and
buffers become constants) and compiles it with tern's compiler into one
executable with one function, ``forward``, whose inputs and outputs carry the
exported program's names. See docs/compiler.md.

``torch.compile(model, backend="tern")`` compiles the graphs Dynamo traces
with the same compiler (docs/torch.md, "torch.compile"); ``stats()``,
``reset_stats()`` and ``clear_cache()`` here report on it and empty its
persistent cache.
"""

from ._frontend import CompiledModel, UnsupportedGraph, export, export_graph, load, to_graph_spec

__all__ = ["export", "export_graph", "load", "CompiledModel", "to_graph_spec", "UnsupportedGraph",
           "backend", "stats", "reset_stats", "clear_cache"]

_DYNAMO_NAMES = ("backend", "stats", "reset_stats", "clear_cache")


def __getattr__(name: str):
    # The torch.compile backend imports Dynamo (about a second): only when used.
    if name in _DYNAMO_NAMES:
        from . import _dynamo

        return getattr(_dynamo, name)
    raise AttributeError(f"module 'torch_tern.compiler' has no attribute '{name}'")
