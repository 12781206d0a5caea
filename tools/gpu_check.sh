#!/bin/bash
# The GPU checklist (docs/gpu.md) in one command, for a machine that got
# the repository and a bundle from tools/gpu_bundle.sh:
#   tools/gpu_check.sh .gpu [OUTDIR]
# Each part's output goes to OUTDIR (default $OUT, else gpu-check/) and the summary to
# stdout; a part that fails does not stop the others.
set -u
bundle=${1:-.gpu}
out=${2:-${OUT:-gpu-check}}
mkdir -p "$out"
. "$bundle/env.sh"
run() { # NAME COMMAND...: runs it, keeps its output, prints one line
    local name=$1
    shift
    local t0=$SECONDS
    "$@" >"$out/$name.log" 2>&1
    local rc=$?
    printf '%-28s exit %-3d %4ds  %s\n' "$name" "$rc" $((SECONDS - t0)) \
        "$(grep -E -c '^ok ' "$out/$name.log") ok, $(grep -E -c '^FAIL' "$out/$name.log") FAIL"
}
nvidia-smi >"$out/nvidia-smi.log" 2>&1
head -12 "$out/nvidia-smi.log"
run kernels-bf16 env PLIANT_PRECISION=bf16 "$bundle/bin/test_kernels_cuda"
run kernels-fp32 env PLIANT_PRECISION=fp32 "$bundle/bin/test_kernels_cuda"
run kernels-tf32 env PLIANT_PRECISION=tf32 "$bundle/bin/test_kernels_cuda"
run nccl "$bundle/bin/test_nccl"
run run-gpu python3 tests/cli/test_run_gpu.py --build "$bundle"
run bench-bf16 "$bundle/bin/gpu_bench_cuda"
grep -v '^ok ' "$out"/kernels-*.log "$out/nccl.log" | head -60
tail -40 "$out/bench-bf16.log"
