"""Train private LoRA adapters on text-classification tasks (by default private LP-FT: the private head, then
DP-SGD LoRA on the top layers from it; ``--lora_recipe one_phase``: DP-SGD + DP-SAT + drift alignment in one phase).

    accelerate launch examples/train_glue.py                      # rotten_tomatoes, packaged MiniLM, ε = 8
    accelerate launch examples/train_glue.py --tasks rotten_tomatoes,election_tweets,reuters_r8,bbc_news
    accelerate launch examples/train_glue.py --task sst2 --model_name_or_path roberta-base   # online (Hub)
    accelerate launch examples/train_glue.py --train_file notes.csv --label_names neg,pos    # your own data

Every ScriptArguments / DPSAMConfig / TrainingArguments field is a flag (``--target_epsilon``, ``--sam_mode``,
``--no-dp``, ``--lora_r``…); the tuned DP recipe (hf_dpmerge/training/recipe.py) comes first, so any flag overrides
it. Per task it writes ``<runs_dir>/<task>/{adapter,encoder_adapter}/`` and ``eval_metrics.json`` from one shared
base under ``<runs_dir>/base``; the workflow is :mod:`hf_dpmerge.scripts.train`.
``--privacy_unit_column movie`` (rotten_tomatoes) makes each film, not each row, the privacy unit (with
``--lora_recipe one_phase``: LP-FT's head phase draws 1024 units, more than the 378 films).
"""

from hf_dpmerge.scripts.train import main
from hf_dpmerge.utils.user_errors import run_script

if __name__ == "__main__":
    run_script(main)
