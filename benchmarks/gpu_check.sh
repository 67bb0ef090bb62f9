#!/usr/bin/env bash
# The GPU checks, in one go, on a machine with a CUDA GPU:
#
#   bash benchmarks/gpu_check.sh OUTDIR
#
# with the test environment installed (requirements.txt; any CUDA build of torch) and mhbook
# importable. It writes into OUTDIR:
#   env.txt      the GPU, torch, CUDA and Python versions
#   cuda.txt     pytest -m cuda (tests/test_cuda.py)
#   bench.txt    python -m benchmarks.bench --device cuda: (b) up to L=16k, (a) in bfloat16 too
#   suite.txt    every test and nbval on every chapter, on the GPU (the browser test of the
#                HTML book is left out: it needs Chromium and the book build, not a GPU)
#   chapters.tar.gz  chapters 3 and 7-16 executed on the GPU (9-12 and 14-16 at their GPU
#                sizes, mhbook.cpu_or_gpu), every cell run even after an error, with a log each
# Each part has its own time limit, and a failing part does not stop the next. The appendix
# "Measured on a GPU" (appendix-gpu.md) records what it printed on an H200.
set -u
out=${1:?usage: bash benchmarks/gpu_check.sh OUTDIR}
mkdir -p "$out/chapters"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."

{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    $py -c "import sys, torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, \
'Python', sys.version.split()[0]); print(torch.cuda.get_device_name(), \
torch.cuda.device_count(), 'GPU(s)')"
    echo "CPU cores: $(nproc)"
} >"$out/env.txt" 2>&1
cat "$out/env.txt"

echo "== pytest -m cuda"
timeout 90 $py -m pytest -m cuda tests/test_cuda.py -v -p no:cacheprovider >"$out/cuda.txt" 2>&1
echo "rc $?"; tail -3 "$out/cuda.txt"

echo "== python -m benchmarks.bench --device cuda"
timeout 150 $py -m benchmarks.bench --device cuda >"$out/bench.txt" 2>&1
echo "rc $?"

echo "== the whole suite with nbval, and chapters 3, 7-16 executed and kept, side by side"
# Every worker's CPU work on 2 threads: 8 workers and 8 kept chapters share the cores.
OMP_NUM_THREADS=2 timeout 280 $py -m pytest -n 8 --dist loadfile --nbval --nbval-current-env \
    chapters tests --ignore tests/test_browser.py -p no:cacheprovider --durations=15 -rfEs \
    >"$out/suite.txt" 2>&1 &
suite=$!
# The kept chapters run in a copy of chapters/, so that their checkpoints (chapter 6's model,
# which chapters 7 and 8 load or train) do not mix with those of the suite's chapters.
copy=$(mktemp -d)
cp chapters/*.ipynb "$copy"
for nb in "$copy"/03-*.ipynb "$copy"/0[7-9]-*.ipynb "$copy"/1[0-6]-*.ipynb; do
    OMP_NUM_THREADS=1 timeout 270 $py -c "
import sys, nbformat, nbclient
nb = nbformat.read(sys.argv[1], as_version=4)
try:
    nbclient.NotebookClient(nb, timeout=260, kernel_name='python3', allow_errors=True,
                            resources={'metadata': {'path': sys.argv[3]}}).execute()
finally:
    nbformat.write(nb, sys.argv[2])" "$nb" "$out/chapters/$(basename "$nb")" "$copy" \
        >"$out/chapters/$(basename "$nb" .ipynb).log" 2>&1 &
done
wait $suite
echo "suite rc $?"
wait
tail -40 "$out/suite.txt"
ls -l "$out/chapters"
tar -czf "$out/chapters.tar.gz" -C "$out" chapters && rm -r "$out/chapters"
