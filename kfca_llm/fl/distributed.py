"""Processes of an ``accelerate launch`` run (or one process): who trains which client, and gathering.

A round's clients are dealt to the processes in contiguous slices of the sorted id list
(``split_between_processes``); every process then gathers every client's result, so all of them hold
the same inputs for scoring and FedAvg. Each client's training is seeded by its own (seed, round,
client), so one process and several give bit-identical results.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import torch

T = TypeVar("T")


class Processes:
    """This process's share of the work (wraps ``accelerate.PartialState``)."""

    def __init__(self, cpu: bool = False):
        from accelerate import PartialState

        self.state = PartialState(cpu=cpu)
        self.device = torch.device(self.state.device)

    @property
    def is_main(self) -> bool:
        return self.state.is_main_process

    def my_share(self, items: Sequence[T]) -> list[T]:
        """This process's contiguous slice of ``items`` (all of them in a single process)."""
        with self.state.split_between_processes(list(items)) as mine:
            return list(mine)

    def gather(self, items: list[Any]) -> list[Any]:
        """Every process's ``items``, concatenated in process order, on every process."""
        if self.state.num_processes == 1:
            return list(items)
        from accelerate.utils import gather_object

        return gather_object(items)

    def broadcast(self, obj: T) -> T:
        """The main process's ``obj`` on every process."""
        if self.state.num_processes == 1:
            return obj
        from accelerate.utils import broadcast_object_list

        return broadcast_object_list([obj if self.is_main else None], from_process=0)[0]

    def barrier(self) -> None:
        self.state.wait_for_everyone()
