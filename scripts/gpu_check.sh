#!/usr/bin/env bash
# The CUDA checks, in one run on a machine with a GPU (the device machines of
# this workplace: torch with CUDA preinstalled, no pyzmq/tensordict/gymnasium/
# torchrl, no network). Wheels for Python 3.12 go in .whl/ first (see
# benchmarks/LOG.md, "GPU runs"); results land in $OUT (or ./gpu-out).
#
#   bash scripts/gpu_check.sh tests        # the CUDA tests only
#   bash scripts/gpu_check.sh weights      # benchmarks.weights_cuda
#   bash scripts/gpu_check.sh inference_gpu   # benchmarks.inference_gpu (central on the GPU)
#   bash scripts/gpu_check.sh atari        # benchmarks.atari, the CNN on the GPU (issue 45 item 6)
#   bash scripts/gpu_check.sh tests weights   # several, in order
#
# atari needs ale-py, gymnasium and opencv-python-headless on the machine (each case that
# cannot import its packages is skipped with the reason): their cp312 wheels are 3 MB,
# 0.5 MB and 64 MB, and EnvPool's 64 MB, so with the 64 MiB a call may carry, bring
# opencv's or EnvPool's wheel, not both, unless the machine has them. ATARI_ARGS picks
# the shape (default: 32 envs, 16 per-worker workers, a case each).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
python3 - <<'EOF' 2>&1 | tee "$OUT/machine.txt"
import os, torch, zmq, tensordict, anyio
print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
print("pyzmq", zmq.__version__, "tensordict", tensordict.__version__, "cpus", os.cpu_count())
try:
    import torchrl
    print("torchrl", torchrl.__version__)
except Exception as exc:
    print("torchrl unavailable:", exc)
EOF
status=0
for what in "${@:-tests}"; do
if [ "$what" = tests ]; then
    xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
    timeout 150 python3 -m pytest -q -p no:cacheprovider -rs --timeout 120 $xdist \
        tests/asyncrl/weights/test_weights_cuda_ipc.py \
        tests/asyncrl/observe/test_statistics.py \
        tests/asyncrl/collectors/test_devices.py \
        tests/asyncrl/weights/test_weights_shared_memory.py \
        tests/asyncrl/weights/test_weights_newest_wins.py \
        tests/asyncrl/weights/test_weights_in_place.py \
        tests/asyncrl/weights/test_weights_distributed.py \
        tests/asyncrl/inference/test_batched_inference_process.py \
        tests/asyncrl/inference/test_batched_collector_limits.py \
        tests/asyncrl/rollout/test_rollout_options.py \
        tests/transports/test_codec.py tests/transports/test_channels.py \
        2>&1 | tee "$OUT/tests.txt" | tail -40
    status=$((status | $?))
fi
if [ "$what" = weights ]; then
    timeout 120 python3 -m benchmarks.weights_cuda 2>"$OUT/weights_cuda.err" \
        | tee "$OUT/weights_cuda.md"
    status=$((status | $?))
    tail -20 "$OUT/weights_cuda.err"
fi
if [ "$what" = inference_gpu ]; then
    timeout 150 python3 -m benchmarks.inference_gpu ${INFERENCE_ARGS:-} 2>"$OUT/inference.err" \
        | tee "$OUT/inference.md"
    status=$((status | $?))
    tail -20 "$OUT/inference.err"
fi
if [ "$what" = atari ]; then
    timeout 560 python3 -m benchmarks.atari --device cuda ${ATARI_ARGS:---envs 32 --workers 16 \
        --repeats 1 --seconds 15 --cases floor,envpool,asyncrl-async,asyncrl-batched,asyncrl-batched-2x4s2} \
        2>"$OUT/atari.err" | tee "$OUT/atari.md"
    status=$((status | $?))
    tail -20 "$OUT/atari.err"
fi
done
exit $status
