#!/usr/bin/env bash
# The main job on the embedded default: two Horovod workers train ResNet-18 on synthetic data
# on this machine's CPU. Each run trains 40 more steps; run it again to resume.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=trainer/presets/demo.yaml

# What `pulumi up` on the dev stack would create, evaluated offline (no Azure account needed).
.venv/bin/python -m dt_commands.plan --stack dev
echo

# Validate first: a bad setting is one line here rather than one traceback per worker.
.venv/bin/python -m trainer --config "$preset" --dry-run
.venv/bin/horovodrun --gloo -np 2 -H localhost:2 \
  .venv/bin/python -m trainer --config "$preset" "$@"
echo "metrics: runs/demo/metrics.jsonl  checkpoints: runs/demo/checkpoints/"
echo "tensorboard: .venv/bin/tensorboard --logdir runs/demo/tensorboard"
echo "run 'make demo' again to resume from the last checkpoint"
