#!/bin/bash
# The GPU checklist (docs/gpu.md) in one command, for a machine that got
# the repository and a bundle from tools/gpu_bundle.sh:
#   tools/gpu_check.sh .gpu [OUTDIR]
# Each part's output goes to a log under a work folder, packed into OUTDIR/gpu-check.tgz
# (OUTDIR: default $OUT, else gpu-check/), packed again after each part; the summary goes to
# stdout. A part that fails does not stop the others, and each has a time limit (a first
# GPU run may hang where none was seen before): about 4 minutes when all goes well.
set -u
bundle=${1:-.gpu}
out=${2:-${OUT:-gpu-check}}
work=$(mktemp -d)
mkdir -p "$out"
. "$bundle/env.sh"
run() { # NAME SECONDS COMMAND...: runs it with a time limit, keeps its output, prints one line
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout -k 5 "$limit" "$@" >"$work/$name.log" 2>&1
    local rc=$?
    tar czf "$out/gpu-check.tgz" --exclude="*.bin" -C "$work" . # what a command stopped at its limit leaves
    printf '%-16s exit %-3d %4ds  %s\n' "$name" "$rc" $((SECONDS - t0)) \
        "$(grep -E -c '^ok ' "$work/$name.log") ok, $(grep -E -c '^(FAIL|not ok)' "$work/$name.log") FAIL"
    return $rc
}
nvidia-smi >"$work/nvidia-smi.log" 2>&1
head -12 "$work/nvidia-smi.log"
run kernels-bf16 100 env PLIANT_PRECISION=bf16 "$bundle/bin/test_kernels_cuda" ||
    run memcheck 120 compute-sanitizer --tool memcheck "$bundle/bin/test_kernels_cuda"
run kernels-fp32 90 env PLIANT_PRECISION=fp32 "$bundle/bin/test_kernels_cuda"
run kernels-tf32 90 env PLIANT_PRECISION=tf32 "$bundle/bin/test_kernels_cuda"
run kernels-gelu-split 90 env PLIANT_PRECISION=tf32 PLIANT_MATMUL_TUNE=3 "$bundle/bin/test_kernels_cuda"
run kernels-untimed 90 env PLIANT_MATMUL_TUNE=0 "$bundle/bin/test_kernels_cuda"
run nccl 45 "$bundle/bin/test_nccl"
run bench-bf16 120 "$bundle/bin/gpu_bench_cuda" --steps 20
run run-gpu 180 env PYTHONUNBUFFERED=1 python3 tests/cli/test_run_gpu.py --build "$bundle"
run recovery 120 tools/gpu_recovery.sh "$bundle/bin/pliant-cuda" cuda "$work/recovery"
if [ -d "$bundle/base" ]; then # earlier builds (gpu_bundle.sh): each against this one, twice
    for z in "$bundle"/base/*.gz; do gunzip -c "$z" >"$work/${z##*/}.bin" && chmod +x "$work/${z##*/}.bin"; done
    run bench-ab 300 sh -c 'for i in 1 2; do for b in "$@"; do echo "== $b"; "$b" --steps 20 |
        grep -E "^peak|^\| NVIDIA"; done; done' sh "$work"/*.gz.bin "$bundle/bin/gpu_bench_cuda"
fi
echo "--- everything but the passing tests"
grep -v -h '^ok ' "$work"/kernels-*.log "$work/nccl.log" "$work/run-gpu.log" | head -80
echo "--- recovery"
cat "$work/recovery.log"
echo "--- bench"
tail -45 "$work/bench-bf16.log"
if [ -f "$work/bench-ab.log" ]; then echo "--- earlier builds against this one"; cat "$work/bench-ab.log"; fi
