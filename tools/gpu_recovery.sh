#!/bin/bash
# Recovery and layer-copy figures of GPU workers sharing one GPU (docs/gpu.md):
#   tools/gpu_recovery.sh PLIANT BACKEND OUTDIR [LAYERS CHANNELS]
# Trains a byte-level GPT (default 12 layers × 768 channels, GPT-2 124M's blocks) with
# 4 workers over host-staged TCP; worker 3 is SIGKILLed at step 3 and one new worker
# joins at step 6. Prints the reconfigure events (duration_ms: from the loss to the first
# step committed by the new plan) and each worker's copy line (received bytes and the
# time, device → page-locked host → TCP → device), with the copy bandwidth.
set -u
pliant=$1 backend=$2 out=$3 layers=${4:-12} channels=${5:-768}
mkdir -p "$out"
text=${PLIANT_SHAKESPEARE:-../shared/data/tinyshakespeare.txt}
"$pliant" tokenize --bytes "$text" "$out/ts" >/dev/null || exit 1
cat >"$out/recovery.yaml" <<EOF
apiVersion: pliant.dev/v1alpha1
kind: TrainingJob
metadata:
  name: gpu-recovery
spec:
  model: {layers: $layers, channels: $channels, heads: $((channels / 64)), vocabSize: 256, maxSeqLen: 256, seed: 7}
  data: {train: $out/ts_train.bin, order: shuffled, seed: 3}
  batch: {global: 8, micro: 2, seqLen: 256}
  optimizer: {lr: 3.0e-4, warmupSteps: 2, schedule: cosine, gradClip: 1.0}
  steps: 10
  profile: synthetic
EOF
"$pliant" run "$out/recovery.yaml" --workers 4 --backend "$backend" \
    --chaos kill:3@step=3,add:1@step=6 --metrics "$out/recovery.jsonl" \
    >"$out/recovery.out" 2>"$out/recovery.err"
rc=$?
echo "recovery run: exit $rc"
grep '"event"' "$out/recovery.jsonl"
grep -o 'generation [0-9]*: layers.*received [0-9]* layers in [0-9]* copies ([0-9]* bytes).*in [0-9.]* ms' \
    "$out/recovery.err" |
    grep -v 'received 0 layers' |
    awk '{ b = $0; sub(/.*\(/, "", b); sub(/ bytes.*/, "", b);
           ms = $0; sub(/.* in /, "", ms); sub(/ ms.*/, "", ms);
           printf "%s: %.2f GB/s\n", $0, (ms > 0 ? b / ms / 1e6 : 0) }'
exit $rc
