#!/usr/bin/env bash
# The quick start (README), run from anywhere:
#   1. train a private LoRA adapter for rotten_tomatoes from the shared base           (examples/train_glue.py)
#      and, as the floor to beat, its private head at the same ε (--train_lora false, runs_floor/)
#   2. add election_tweets as another organisation released it: its adapter, its private head and their privacy
#      records (examples/released/, trained by the same script; see its README)
#   3. merge the two encoders                                                         (stock mergekit-yaml)
#   4. per-task retention / interference of the merged model                          (hf-dpmerge evaluate)
#   5. stage the Hub release with its privacy model card, no upload                   (hf-dpmerge push --dry-run)
# Extra arguments go to train_glue.py (e.g. --target_epsilon 4). TASKS (trained here), RELEASED (copied from
# examples/released/, "" for none), MERGE_CONFIG and MERGED override the defaults; examples/full_run.sh trains four
# tasks instead. Outputs: runs/, runs_floor/, merged/, merged-hub/. AS_ADAPTER=1 merges in factor space instead
# (hf-dpmerge merge --as-adapter; a method with a factor-space form, not the quick start's emr): MERGED is then one
# LoRA adapter (the shared A, the merged B, no head; stock PeftModel.from_pretrained(base, MERGED)), and steps 4-5,
# which read a merged model, are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" HF_DATASETS_OFFLINE="${HF_DATASETS_OFFLINE:-1}"
export TRANSFORMERS_OFFLINE="${TRANSFORMERS_OFFLINE:-1}" TOKENIZERS_PARALLELISM=false
TASKS="${TASKS:-rotten_tomatoes}"
RELEASED="${RELEASED-election_tweets}"
MERGE_CONFIG="${MERGE_CONFIG:-merge_configs/quickstart.yaml}"
MERGED="${MERGED:-merged}"
ALL="$TASKS${RELEASED:+,$RELEASED}"
if [ -e "$MERGED" ]; then
  echo "quickstart: $MERGED already exists; remove it or set MERGED=<new dir>" >&2
  exit 1
fi
for task in ${RELEASED//,/ }; do
  for runs in runs runs_floor; do
    if [ -e "$runs/$task" ] && ! cmp -s "examples/released/$runs/$task/adapter/dp_privacy.json" \
        "$runs/$task/adapter/dp_privacy.json"; then
      echo "quickstart: $runs/$task exists and is not the released $task; remove it or set RELEASED=\"\"" >&2
      exit 1
    fi
  done
done
for task in ${RELEASED//,/ }; do  # checked above: copied only where missing
  for runs in runs runs_floor; do
    mkdir -p "$runs" && { [ -e "$runs/$task" ] || cp -r "examples/released/$runs/$task" "$runs/$task"; }
  done
done

accelerate launch --quiet --cpu --num_processes 1 examples/train_glue.py --tasks "$TASKS" "$@"
if [ "${AS_ADAPTER:-0}" = 1 ]; then
  hf-dpmerge merge "$MERGE_CONFIG" "$MERGED" --as-adapter
  exit 0
fi
mergekit-yaml "$MERGE_CONFIG" "$MERGED" --lora-merge-cache runs/lora-cache
accelerate launch --quiet --cpu --num_processes 1 examples/train_glue.py --tasks "$TASKS" --train_lora false \
  --runs_dir runs_floor "$@"
hf-dpmerge evaluate --runs runs --merged "$MERGED" --tasks "$ALL" --floor_runs runs_floor
hf-dpmerge push "$MERGED" --runs runs --tasks "$ALL" --eval_json runs/eval/results.json --dry-run
