#!/usr/bin/env bash
# Regenerates sample_logs/: real runs of the bundled trainer (default off-policy setting: lr 6e-4
# decayed linearly to 0 over the run, 8 epochs × 4 mini-batches, rollouts 4 iterations stale, dual-clip 3, geometric-mean turn ratio,
# CTN λ adapting from 32 towards a clip fraction of 0.05, its k3 gradient capped at 3), turn rows of
# each iteration's first update. 50 iterations (1,600 updates) keep the folder under 5 MB.
# Usage: sample_logs/make_sample_logs.sh   (from the repository root, after `make install`)
set -euo pipefail
cd "$(dirname "$0")/.."
SORL=${SORL:-.venv/bin/sorl}
OUT=sample_logs
ITERS=${ITERS:-50}
PPO_SEED=${PPO_SEED:-0}
GRPO_SEED=${GRPO_SEED:-0}
rm -rf "$OUT"/token-ppo "$OUT"/so-ppo "$OUT"/so-ppo-auto-ctn "$OUT"/ppo-auto-ctn "$OUT"/grpo "$OUT"/so-grpo
common=(--steps "$ITERS" --log-dir "$OUT" --log-turns first --quiet)
# exit status 3 = the run collapsed: expected for some of these, so it is not an error here
run() { "$SORL" train "$@" "${common[@]}" || [ $? -eq 3 ]; }
run --algo ppo --seed "$PPO_SEED" --run-name token-ppo &
run --algo so_ppo --ctn auto --seed "$PPO_SEED" --run-name so-ppo-auto-ctn &
wait
run --algo ppo --ctn auto --seed "$PPO_SEED" --run-name ppo-auto-ctn &
run --algo grpo --seed "$GRPO_SEED" --run-name grpo &
wait
run --algo so_grpo --seed "$GRPO_SEED" --run-name so-grpo
du -sh "$OUT"
