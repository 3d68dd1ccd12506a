"""``hf-dpmerge merge`` that blocks once the merged model's weights and config.json are written, until killed.

``python crash_merge.py MARKER CONFIG OUT [hf-dpmerge merge options]`` runs ``hf-dpmerge merge``'s command
line. When the merge has written its weights and saves the output's config.json (where a non-atomic writer
would leave a complete-looking model at OUT), it creates the file MARKER and sleeps.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from transformers import PretrainedConfig

from hf_dpmerge.cli.main import main

MARKER, OUT = Path(sys.argv[1]), Path(sys.argv[3])
_save_pretrained = PretrainedConfig.save_pretrained


def save_then_pause(self: PretrainedConfig, save_directory: str, *args, **kwargs):
    result = _save_pretrained(self, save_directory, *args, **kwargs)
    if Path(save_directory).name == OUT.name:  # the merge output, not a --lora-merge-cache entry
        MARKER.touch()
        time.sleep(600)
    return result


if __name__ == "__main__":
    PretrainedConfig.save_pretrained = save_then_pause
    sys.exit(main(["merge", *sys.argv[2:]]))
