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
"""

from ._frontend import CompiledModel, UnsupportedGraph, export, export_graph, load, to_graph_spec

__all__ = ["export", "export_graph", "load", "CompiledModel", "to_graph_spec", "UnsupportedGraph"]
