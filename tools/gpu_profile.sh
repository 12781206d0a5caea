#!/bin/bash
# Hardware counters of the training step's main kernels (Nsight Compute), for a GPU
# machine that got the repository and a bundle from tools/gpu_bundle.sh:
#   tools/gpu_profile.sh .gpu [OUTDIR] [KERNEL ...]
# Profiles one launch of each named kernel (default: the bf16 attention kernels and
# their packing passes) in gpu_bench_cuda's second step, with
# the sections that say what limits a kernel: speed of light, the pipes' utilisation,
# shared-memory and cache traffic, warp stall reasons, occupancy. The full reports go to
# OUTDIR/ncu-KERNEL.txt; stdout gets each kernel's duration and headline figures.
set -u
bundle=${1:-.gpu}
out=${2:-${OUT:-gpu-profile}}
shift 2 2>/dev/null || shift $#
kernels=${*:-flash_forward_bf16_kernel flash_backward_dkv_bf16_kernel flash_backward_dq_bf16_kernel attention_pack_qkv_kernel attention_delta_pack_kernel}
mkdir -p "$out"
. "$bundle/env.sh"
command -v ncu >/dev/null || { echo "gpu_profile: ncu is not on PATH" >&2; exit 1; }
for k in $kernels; do
    # --launch-skip 12: past the warm-up step's launches (one per layer)
    timeout -k 5 120 ncu --clock-control none -k "regex:^$k\$" --launch-skip 12 --launch-count 1 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section Occupancy \
        --section LaunchStats --section InstructionStats --section SourceCounters \
        "$bundle/bin/gpu_bench_cuda" --steps 1 --warmup 1 >"$out/ncu-$k.txt" 2>&1
    echo "== $k (ncu exit $?)"
    grep -E 'Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per Thread|Achieved Occupancy|Issue Slots Busy|One or More Eligible|No Eligible|Executed Ipc Active|L1/TEX Hit|Shared Memory|Bank' \
        "$out/ncu-$k.txt" | sed 's/  */ /g' | head -24
done
