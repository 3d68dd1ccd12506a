"""The floor of the stress grid: the base encoder with each task's own head, trained alone (LoRA frozen at
B = 0; under DP the head is the accounted release, at the cell's ε). The gain a merge retains over it,
(merged − floor) / (individual − floor), is :func:`hf_dpmerge.data.metrics.gain_retained` (as
``hf-dpmerge evaluate`` reports it); the report applies it to task-averaged accuracies per seed: a per-task
ratio explodes where an adapter barely beats its floor.
"""

from __future__ import annotations

from .grid import FLOOR_TRAINER

Group = tuple[str, float | None]


def floor_group(group: Group) -> Group:
    """The floor that a (trainer, ε) group is measured against: the head-only model at the same ε."""
    return FLOOR_TRAINER, group[1]
