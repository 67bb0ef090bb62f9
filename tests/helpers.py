"""Small helpers shared by the equivalence tests (imported as ``helpers``)."""

import torch


def randn(*shape, dtype, seed):
    """A seeded random tensor that requires grad."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype, requires_grad=True)


def upstream(output, seed=99):
    """A seeded random upstream gradient shaped like ``output``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(output.shape, generator=g, dtype=output.dtype)
