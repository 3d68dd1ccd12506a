#!/usr/bin/env bash
# The whole flow on the packaged defaults (README "main command"), run from anywhere:
#   1. train one private LoRA adapter per task from one shared base     (examples/train_glue.py)
#      and, as the floor to beat, each task's private head at the same ε (--train_lora false, runs_floor/)
#   2. merge the encoders with the DP-aware method                      (stock mergekit-yaml)
#   3. per-task retention / interference of the merged model            (hf-dpmerge evaluate)
#   4. stage the Hub release with its privacy model card, no upload     (hf-dpmerge push --dry-run)
# Extra arguments go to train_glue.py (e.g. --target_epsilon 4); TASKS, MERGE_CONFIG and MERGED override the
# task list, the merge plan and the output. Outputs: runs/, runs_floor/, merged/, merged-hub/.
# AS_ADAPTER=1 merges in factor space instead (hf-dpmerge merge --as-adapter): MERGED is then one LoRA adapter
# (the shared A, the merged B, no head; stock PeftModel.from_pretrained(base, MERGED)), and steps 3-4, which
# read a merged model, are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" HF_DATASETS_OFFLINE="${HF_DATASETS_OFFLINE:-1}"
export TRANSFORMERS_OFFLINE="${TRANSFORMERS_OFFLINE:-1}" TOKENIZERS_PARALLELISM=false
TASKS="${TASKS:-rotten_tomatoes,election_tweets,reuters_r8,bbc_news}"
MERGE_CONFIG="${MERGE_CONFIG:-merge_configs/dp.yaml}"
MERGED="${MERGED:-merged}"
if [ -e "$MERGED" ]; then
  echo "quickstart: $MERGED already exists; remove it or set MERGED=<new dir>" >&2
  exit 1
fi

accelerate launch --quiet --cpu --num_processes 1 examples/train_glue.py --tasks "$TASKS" "$@"
if [ "${AS_ADAPTER:-0}" = 1 ]; then
  hf-dpmerge merge "$MERGE_CONFIG" "$MERGED" --as-adapter
  exit 0
fi
mergekit-yaml "$MERGE_CONFIG" "$MERGED" --lora-merge-cache runs/lora-cache
accelerate launch --quiet --cpu --num_processes 1 examples/train_glue.py --tasks "$TASKS" --train_lora false \
  --runs_dir runs_floor "$@"
hf-dpmerge evaluate --runs runs --merged "$MERGED" --tasks "$TASKS" --floor_runs runs_floor
hf-dpmerge push "$MERGED" --runs runs --tasks "$TASKS" --eval_json runs/eval/results.json --dry-run
