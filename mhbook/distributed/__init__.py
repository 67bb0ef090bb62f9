"""Heads and tokens across processes: starting ranks (:func:`~mhbook.distributed.launch.run`),
tensor parallelism (Megatron's split of the heads) and context parallelism (Ulysses, ring
attention), with the harnesses that check them against one process."""

from . import context_parallel, launch, tensor_parallel, verify
from .context_parallel import *  # noqa: F403
from .launch import *  # noqa: F403
from .tensor_parallel import *  # noqa: F403
from .verify import *  # noqa: F403

__all__ = [*launch.__all__, *tensor_parallel.__all__, *context_parallel.__all__, *verify.__all__]
