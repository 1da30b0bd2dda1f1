#!/usr/bin/env bash
# What a GPU machine with nothing to install (Python, NumPy, CuPy, torch CUDA there already) runs for issue 26: the
# CUDA tests, then the GPU bench; logs and results in $OUT (else ./gpu-out). CuPy's compiled kernels are cached in
# .cupy_cache (carry it to the next run to skip their compilation).
#   bash tests/cuda/run_on_gpu.sh               # tests (TEST_SECONDS, default 240) then bench (BENCH_SECONDS, 150)
#   SKIP_BENCH=1 bash tests/cuda/run_on_gpu.sh -k dlpack   # extra arguments go to pytest
set -u
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$PWD/.cupy_cache}
export OPFORGE_FAILURE_LOG=$out/failures.txt
py=${PY:-python3}
start=$(date +%s)
{ nvidia-smi -L; nproc; $py -c "import sys, numpy, cupy, torch; print(sys.version.split()[0], 'numpy', numpy.__version__,
'cupy', cupy.__version__, 'torch', torch.__version__, torch.cuda.get_device_name())"; } 2>&1 | tee "$out/env.txt"
if [ -d .cupy_cache ]; then echo "cupy cache: $(ls .cupy_cache | wc -l) kernels"; fi
timeout "${TEST_SECONDS:-240}" $py -m pytest -q -n "${WORKERS:-12}" -p no:cacheprovider -rfE --tb=short \
    --durations=25 tests/cuda "$@" > "$out/tests.log" 2>&1
echo "tests: rc=$? after $(( $(date +%s) - start )) s"
grep -E "^(FAILED|ERROR)" "$out/tests.log" | cut -c1-300 | head -60
[ -f "$out/failures.txt" ] && grep -c "^====" "$out/failures.txt"
tail -3 "$out/tests.log"
if [ -z "${SKIP_BENCH:-}" ] && [ -f bench/gpu.py ]; then
    timeout "${BENCH_SECONDS:-150}" $py bench/gpu.py --out "$out" ${BENCH_ARGS:-} > "$out/bench.log" 2>&1
    echo "bench: rc=$? after $(( $(date +%s) - start )) s"
    tail -40 "$out/bench.log"
fi
tar czf "$out/cupy_cache.tgz" .cupy_cache 2>/dev/null && ls -la "$out/cupy_cache.tgz"
