"""Train private LoRA adapters of a causal language model (default: the packaged SmolLM2-135M-Instruct) on
classification tasks written as instructions ("Review: … Is this review fresh or rotten?" → "fresh").

    accelerate launch examples/train_causal_lm.py       # rotten_tomatoes, ε = 8
    accelerate launch examples/train_causal_lm.py --tasks rotten_tomatoes,election_tweets --max_train_samples 2000
    accelerate launch examples/train_causal_lm.py --train_file notes.csv --label_names neg,pos --verbalizers no,yes

Own data with fewer than 1600 training rows needs a ``--per_device_train_batch_size`` below their number
(docs/workflow.md "Your own data").

Every CausalScriptArguments / DPSAMConfig / TrainingArguments field is a flag; the causal DP recipe comes first,
so any flag overrides it. Per task it writes ``<runs_dir>/<task>/adapter/`` and ``eval_metrics.json`` from one
float32 base under ``<runs_dir>/base`` (default ``runs_causal``); the workflow is
:mod:`hf_dpmerge.scripts.train_causal_lm`.
"""

from hf_dpmerge.scripts.train_causal_lm import main
from hf_dpmerge.utils.user_errors import run_script

if __name__ == "__main__":
    run_script(main)
