"""The floor of the stress grid: the base encoder with each task's own head, trained alone (LoRA frozen at
B = 0; under DP the head is the accounted release, at the cell's ε), and the gain a merge retains over it.

    gain retained = (merged − floor) / (individual − floor)

1: the merge keeps everything the adapter added to the head-only model; 0: it keeps nothing the head alone
could not do. Undefined (None) when the adapter does not beat the floor. The report applies it to task-averaged
accuracies per seed: a per-task ratio explodes where an adapter barely beats its floor.
"""

from __future__ import annotations

from .grid import FLOOR_TRAINER

Group = tuple[str, float | None]


def floor_group(group: Group) -> Group:
    """The floor that a (trainer, ε) group is measured against: the head-only model at the same ε."""
    return FLOOR_TRAINER, group[1]


def gain_retained(merged: float, individual: float, floor: float) -> float | None:
    """(merged − floor) / (individual − floor); None when individual ≤ floor."""
    if individual <= floor:
        return None
    return (merged - floor) / (individual - floor)
