#!/usr/bin/env bash
# The GPU checks in one go, for a machine with CUDA:
#     bash benchmarks/cuda_check.sh DATA_DIR WORK_DIR [MINUTES]
# 1. tests/test_cuda.py (translation on CUDA equals the CPU's, exact resume of a CUDA run);
# 2. the de->en Transformer preset trained on the GPU for MINUTES (default 2) minutes;
# 3. its test_2016_flickr score and decoding time, greedy and beam 5, on the GPU, and beam 5
#    on the CPU (the two devices should agree to within near ties);
# 4. a data-parallel start through torch.distributed (nccl, one process per GPU), 100 updates.
# DATA_DIR holds the gzipped Multi30k files (train, val, test_2016_flickr; .de and .en).
# Every step runs even if one before it fails; the script's status is the number that failed.
set -u
data=$1 work=$2 minutes=${3:-2}
python=${PYTHON:-python}
preset=configs/multi30k_de_en_transformer.yaml
failed=0
TIMEFORMAT="%R s wall"

step() {
    echo "=== $*"
    "$@" || { echo "=== FAILED: $*"; failed=$((failed + 1)); }
}

evaluate() {  # DEVICE BEAM
    time "$python" -m attnmt evaluate "$work/de_en" --device "$1" --beam "$2" \
        --src "$data/test_2016_flickr.de.gz" --ref "$data/test_2016_flickr.en.gz"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
"$python" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
step "$python" -m pytest -q -p no:cacheprovider tests/test_cuda.py
step time "$python" -m attnmt train "$preset" --run-dir "$work/de_en" --set "data.dir=$data" \
    --set train.device=cuda --set "train.max_minutes=$minutes"
step evaluate cuda 1
step evaluate cuda 5
step evaluate cpu 5
step "$python" -m attnmt train "$preset" --run-dir "$work/de_en_ddp" --nproc-per-node \
    "$("$python" -c 'import torch; print(torch.cuda.device_count())')" --set "data.dir=$data" \
    --set train.device=cuda --set train.max_steps=100 --set train.validate_every=100
tail -n 2 "$work/de_en/log.csv" "$work/de_en_ddp/log.csv"
echo "=== $failed step(s) failed"
exit "$failed"
