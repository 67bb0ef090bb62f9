"""Heads and tokens across processes: starting ranks (:func:`~mhbook.distributed.launch.run`),
tensor parallelism (Megatron's split of the heads) and context parallelism (Ulysses, ring
attention), with the harnesses that check them against one process."""

from ..core.public import gather

#: The modules whose public names this folder offers (and ``mhbook`` with it).
__all__ = gather(globals(), ("launch", "tensor_parallel", "context_parallel", "verify"))
