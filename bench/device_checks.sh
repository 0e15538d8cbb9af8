#!/usr/bin/env bash
# The GPU checks in one run, for a machine with a CUDA device and the project installed (`pip install -e '.[test]'`).
#
#     bash bench/device_checks.sh [OUT_DIR]        # OUT_DIR: default $OUT, else ./device-checks
#
# Each step runs under its own `timeout` and writes its output to OUT_DIR/<step>.log as it comes; OUT_DIR/summary.txt
# gets one line per step when it ends (rc 124: it ran past its limit). The most wanted number comes first, so that a
# lease cut short still brings it back:
#
#   device    torch's view of the machine (name, memory, CPU threads)
#   evaluate  bench/bench_evaluate.py on the device: the evaluate stage of one TopK cell and one CEDAR cell (20 k rows,
#             d 768, 4,096 latents, k 32), every part timed, against encoding their rows (goal: <= 5 s a cell on an
#             H200)
#   tests     the tests that compare the device with the CPU (FMS and the probes on CUDA, the training feed, open_clip's
#             preprocessing on the device); skipped, saying so, where pytest is not installed
#   smoke     bench/gpu_smoke.py at its defaults: extraction and the train stage against their warm bare loops
#
# Limits in seconds: LIMIT_EVALUATE (default 240), LIMIT_TESTS (90), LIMIT_SMOKE (240); the three fit one 10-minute call.
# Exit status: 1 when a step failed or ran past its limit (every step still runs), else 0.
# SMALL=1: every step at toy sizes on whatever device there is (a CPU too): it proves the script, and its numbers say
# nothing about a GPU.
set -u
out=${1:-${OUT:-device-checks}}
mkdir -p "$out"
out=$(cd "$out" && pwd)  # absolute: the steps run from the repository root
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0

step() {  # step NAME LIMIT COMMAND...: run it, its output to OUT/NAME.log, its rc to OUT/summary.txt
    local name=$1 limit=$2 start rc
    shift 2
    start=$(date +%s)
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    rc=$?
    [ "$rc" = 0 ] || failed=1
    echo "$name rc=$rc seconds=$(( $(date +%s) - start ))" >> "$out/summary.txt"
}

if [ "${SMALL:-0}" = 1 ]; then
    evaluate_sizes=(--n 3000 --d 64 --dict 256 --k 8 --steps 20)
    smoke_sizes=(--n 20000 --d 64 --dict 1024 --k 8 --steps 30 --batch 256 --images 16)
else
    evaluate_sizes=()
    smoke_sizes=()
fi

step device 60 "$python" -c "
import os, torch
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'threads', torch.get_num_threads(), 'cpus', os.cpu_count())
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(i, p.name, round(p.total_memory / 2**30, 1), 'GiB')
print('cuda available:', torch.cuda.is_available())"
step evaluate "${LIMIT_EVALUATE:-240}" "$python" bench/bench_evaluate.py --device auto --repeat 2 --workdir "$work/evaluate" "${evaluate_sizes[@]}"
if "$python" -c "import pytest" 2> /dev/null; then
    step tests "${LIMIT_TESTS:-90}" "$python" -m pytest -q -p no:cacheprovider tests/test_metrics_fms.py tests/test_metrics_probe.py \
        tests/test_feed.py tests/test_encoders_pixels.py -m "not slow and not slurm"
else
    echo "tests skipped: pytest is not installed" >> "$out/summary.txt"
fi
step smoke "${LIMIT_SMOKE:-240}" "$python" bench/gpu_smoke.py --workdir "$work/smoke" "${smoke_sizes[@]}"
cat "$out/summary.txt"
exit "$failed"
