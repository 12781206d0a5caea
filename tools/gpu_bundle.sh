#!/bin/sh
# Packs the GPU programs and the shared libraries they need beyond CUDA's into one folder,
# for a GPU machine that has CUDA but not this project's build dependencies (the device
# tool's machines: no package installs there). Run here after `make cuda`:
#   tools/gpu_bundle.sh .gpu        (add /.gpu/ to .git/info/exclude, carry .gpu)
# and there `tools/gpu_check.sh .gpu` (or `. .gpu/env.sh` and run .gpu/bin/* yourself).
# env.sh puts .gpu/lib first on LD_LIBRARY_PATH, and NCCL from the machine (CUDA's lib64, or
# the nvidia-nccl wheel of its PyTorch) after it.
#   tools/gpu_bundle.sh .gpu OLD/gpu_bench_cuda ...
# also packs earlier builds' benchmarks (stripped and gzipped, about 1 MB each), which
# gpu_check.sh runs alternately with this build's. The bundle and the repository leave room
# in the device tool's 64 MiB for one such benchmark (two overflow it by tens of KB).
set -eu
out=${1:-.gpu}
[ $# -gt 0 ] && shift
mkdir -p "$out/bin" "$out/lib"
for b in build/tests/test_kernels_cuda build/tests/test_nccl build/bin/pliant-cuda \
         build/bin/pliant build/bench/gpu_bench_cuda; do
    [ -x "$b" ] || { echo "gpu_bundle: $b is missing (make cuda)" >&2; exit 1; }
    cp "$b" "$out/bin/"
done
# every resolved library but the C runtime, the loader and CUDA's own (the machine has those)
for b in "$out"/bin/*; do ldd "$b"; done | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
    grep -v -E '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so|/usr/local/cuda|lib(cuda|cudart|cublas|cublasLt|nccl)\.so' |
    while read -r lib; do cp -L "$lib" "$out/lib/"; done
# without debug information: the device tool carries at most 64 MiB with the repository
strip --strip-debug "$out"/bin/* "$out"/lib/* 2>/dev/null || true
# earlier builds' benchmarks, named base1.gz, base2.gz, ... in the order given
rm -rf "$out/base"
n=0
for b in "$@"; do
    n=$((n + 1))
    mkdir -p "$out/base"
    strip --strip-all -o "$out/base/base$n" "$b"
    gzip -9 "$out/base/base$n"
done
# the CLI tests' corpus (the GPU machine gets the repository without ../shared)
if [ -f ../shared/data/tinyshakespeare.txt ]; then cp ../shared/data/tinyshakespeare.txt "$out/"; fi
cat > "$out/env.sh" <<'ENV'
# Source me: the bundle's libraries first, then NCCL from the machine.
here=$(cd "$(dirname "${BASH_SOURCE:-$0}")" 2>/dev/null && pwd || echo .gpu)
nccl=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0] + "/lib")' 2>/dev/null || true)
export LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64${nccl:+:$nccl}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ -f "$here/tinyshakespeare.txt" ]; then export PLIANT_SHAKESPEARE="$here/tinyshakespeare.txt"; fi
ENV
du -sh "$out"
