"""``dp_noise_stats.safetensors``: per-coordinate statistics of the privatised gradients, shipped beside an adapter.

The dp_aware merge needs each coordinate's DP noise variance, and under Adam that depends on the
coordinate's signal-to-noise ratio (docs/design.md §6). The file holds, per trainable tensor
(keyed like ``adapter_model.safetensors``): Adam's bias-corrected second moment v̂ = E[g̃²] (none for SGD),
under Adam(W) the noise variance of the final value linearised along the run's trajectory
(:mod:`hf_dpmerge.noise.linearised_response`; absent in older files and in resumed runs), its parameter group;
per group the learning rate η_t of every step taken and the weight decay; and the optimizer's name and
hyper-parameters, and σ_g = σ·C/B_exp, the per-step noise std of one coordinate.

Privacy: every value is computed from the privatised gradients g̃ (after clipping and noise), what is built from
them (Adam's state, the weights) or from public hyper-parameters, so releasing it is post-processing of the DP
mechanism and costs no privacy.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

NOISE_STATS_NAME = "dp_noise_stats.safetensors"
_MOMENT = "second_moment/"
_RESPONSE = "response_variance/"
_LRS = "lr/"


@dataclass
class NoiseStats:
    """What the noise model needs about one training run (see the module docstring)."""

    optimizer: dict[str, Any]
    noise_std: float
    lrs: dict[str, torch.Tensor]
    weight_decay: dict[str, float]
    groups: dict[str, str]
    second_moments: dict[str, torch.Tensor] = field(default_factory=dict)
    response_variances: dict[str, torch.Tensor] = field(default_factory=dict)

    def save(self, directory: str | os.PathLike) -> Path:
        from safetensors.torch import save_file

        tensors = {
            _MOMENT + name: value.detach().float().cpu().contiguous() for name, value in self.second_moments.items()
        }
        tensors |= {_RESPONSE + name: value.detach().float().cpu().contiguous()
                    for name, value in self.response_variances.items()}
        tensors |= {_LRS + group: value.double().cpu().contiguous() for group, value in self.lrs.items()}
        header = {"optimizer": self.optimizer, "noise_std": self.noise_std, "weight_decay": self.weight_decay,
                  "groups": self.groups}
        path = Path(directory) / NOISE_STATS_NAME
        save_file(tensors, path, metadata={"format": "pt", "noise_stats": json.dumps(header, sort_keys=True)})
        return path

    @classmethod
    def load(cls, directory: str | os.PathLike) -> NoiseStats:
        from safetensors import safe_open

        path = Path(directory) / NOISE_STATS_NAME
        with safe_open(path, "pt") as handle:
            header = json.loads((handle.metadata() or {})["noise_stats"])
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 (safe_open is not a dict)
        return cls(
            optimizer=header["optimizer"],
            noise_std=float(header["noise_std"]),
            lrs={k.removeprefix(_LRS): v for k, v in tensors.items() if k.startswith(_LRS)},
            weight_decay={k: float(v) for k, v in header["weight_decay"].items()},
            groups=header["groups"],
            second_moments={k.removeprefix(_MOMENT): v for k, v in tensors.items() if k.startswith(_MOMENT)},
            response_variances={k.removeprefix(_RESPONSE): v for k, v in tensors.items() if k.startswith(_RESPONSE)},
        )

    def parameter(self, name: str) -> tuple[torch.Tensor, float, torch.Tensor | None] | None:
        """(η_t of its group, its weight decay, its v̂ or None) for a saved tensor name, None if not trained."""
        group = self.groups.get(name)
        if group is None:
            return None
        return self.lrs[group], self.weight_decay[group], self.second_moments.get(name)
