"""The tiny private training run of the kill -9 test: ``python crash_training.py WORKDIR MODE``.

Eight DP-SAT steps with a checkpoint every two, then the adapter is released to ``WORKDIR/adapter``.
MODE ``full`` runs straight through; ``resume`` continues from the last complete checkpoint of an earlier
run in the same WORKDIR; ``pause`` blocks inside the step-6 checkpoint (its model and ``dp_state.pt`` are
written, its optimizer and ``trainer_state.json`` are not) after creating ``WORKDIR/paused``, until killed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from transformers import Trainer

from tests.utils.training_helpers import make_trainer

PAUSE_STEP = 6


def pause_inside_checkpoint(workdir: Path) -> None:
    original = Trainer._save_optimizer_and_scheduler

    def paused(self: Trainer, output_dir: str) -> None:
        if self.state.global_step == PAUSE_STEP:
            (workdir / "paused").touch()
            time.sleep(600)
        original(self, output_dir)

    Trainer._save_optimizer_and_scheduler = paused


def main(workdir: Path, mode: str) -> None:
    if mode == "pause":
        pause_inside_checkpoint(workdir)
    trainer = make_trainer(workdir, max_steps=8, save_strategy="steps", save_steps=2, sam_rho=0.1)
    trainer.train(resume_from_checkpoint=True if mode == "resume" else None)
    trainer.save_model(str(workdir / "adapter"))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
