"""Entry point of the ``torch.backends`` group: ``import torch`` calls ``load()``.

A module of its own, so that loading the entry point never depends on the
package's attributes: when the user imports torch_tern first, torch's
autoloading runs while torch_tern is still half imported, and that import
finishes the registration itself.
"""


def load() -> None:
    import torch_tern  # noqa: F401  (registers the tern backend on import)
