#!/usr/bin/env bash
# The GPU measurements of issue #47 as one prepared command for a lent device machine (no network there).
#
# Here, once, with network:  make gpu-wheels   (→ .whl/: duckdb, trl, datasets, dill, multiprocess, which the
#   device image lacks; about 26 MB, git-ignored through .git/info/exclude)
# Then the device tool's run, carrying the wheels, with time left for one rerun (about 7 minutes of work):
#   command "bash benchmarks/gpu_check.sh", carry [".whl"], timeout_s 560
#
# Into $OUT (benchmarks/results/ where OUT is unset): gpu_device.txt (GPU, driver, torch, transformers),
# gpu_overhead.txt (bench_overhead.py: the monitor's end-to-end overhead on a Qwen2-0.5B-shaped bf16 update at
# 8×2048 and 4×8192 tokens, with log_update(sync=True) beside it, and the synchronizing calls per log_update)
# and gpu_trl.txt (trl_step_overhead.py: TRL's GRPOTrainer update plain, with MonitoredGRPOTrainer and with
# SORLGRPOTrainer, and the synchronizing calls in the monitor's part of an update). Each step has its own
# time limit, so one that fails or runs long leaves the others' files.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-benchmarks/results}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "gpu_check: the carried wheels did not install" >&2; exit 1; }
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TRANSFORMERS_VERBOSITY=error HF_HUB_DISABLE_PROGRESS_BARS=1 TOKENIZERS_PARALLELISM=false

{
  echo "# gpu_check.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'transformers', transformers.__version__)"
} >"$out/gpu_device.txt" 2>&1
cat "$out/gpu_device.txt"

step() {  # name, limit in seconds, command...: its output to $out/<name>.txt, its exit status at the end
  local name=$1 limit=$2
  shift 2
  local started=$SECONDS
  timeout "$limit" "$@" >"$out/$name.txt" 2>&1
  local status=$?
  echo "# exit $status after $((SECONDS - started)) s: $*" >>"$out/$name.txt"
  echo "== $name (exit $status, $((SECONDS - started)) s)"
  grep -v '^#' "$out/$name.txt" | tail -n 25
}

step gpu_overhead 300 python3 benchmarks/bench_overhead.py --device cuda --blocks 8 --block-seconds 2 --compare-sync
step gpu_trl 200 python3 benchmarks/trl_step_overhead.py --device cuda --model qwen2-0.5b --rounds 2 --steps 8 \
  --completion 128
