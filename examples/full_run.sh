#!/usr/bin/env bash
# The full run (README): examples/quickstart.sh with four private adapters trained here (rotten_tomatoes,
# election_tweets, reuters_r8, bbc_news; nothing released is added) and their private heads, merged with
# merge_configs/dp.yaml. Extra arguments go to train_glue.py; TASKS, MERGE_CONFIG, MERGED and AS_ADAPTER as there.
set -euo pipefail
TASKS="${TASKS:-rotten_tomatoes,election_tweets,reuters_r8,bbc_news}" RELEASED="" \
  MERGE_CONFIG="${MERGE_CONFIG:-merge_configs/dp.yaml}" exec bash "$(dirname "$0")/quickstart.sh" "$@"
