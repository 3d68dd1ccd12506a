"""The workflows behind the command lines: :mod:`.train` (``examples/train_glue.py``) and the task/LoRA arguments
it shares with ``hf-dpmerge audit``."""
