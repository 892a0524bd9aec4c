#!/bin/bash
# The "Owed on a GPU" rows of docs/benchmarks.md as one batch for the lent GPU machine, most
# valuable first, each bounded by its own limit and by the call's deadline; the log goes to
# $OUT/all.log. Run from the repository root there:
#   BUDGET=540 bash benchmarks/owed_on_gpu.sh        (with .whl carried: see below)
# ONLY="name name ..." runs just those steps (a second call finishing what the first left).
# The device's python3 has torch, torchvision, timm, lightning and HTA's needs but not
# pydantic, optuna, torchao, simplejpeg or HolisticTraceAnalysis: download their wheels here
# into .whl/ (docs/benchmarks.md, "Owed on a GPU") and carry that folder.
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}  # the interpreter that has torch (the device's python3)
OUT=${OUT:-/tmp/owed}; mkdir -p "$OUT"
T0=$(date +%s); DEADLINE=$((T0 + ${BUDGET:-540}))
LOG=$OUT/all.log
step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 lim=$2; shift 2
  if [ -n "$ONLY" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  local now; now=$(date +%s); local left=$((DEADLINE - now))
  if [ $left -lt 15 ]; then echo "=== SKIPPED $name (no time left)" >>"$LOG"; return; fi
  [ "$lim" -gt $left ] && lim=$left
  echo "=== [$((now - T0))s] $name (limit ${lim}s): $*" >>"$LOG"
  timeout -k 5 "$lim" "$@" >>"$LOG" 2>&1; local rc=$?
  echo "=== $name rc=$rc after $(( $(date +%s) - now ))s" >>"$LOG"
}
WHEELS=${WHEELS:-.whl}
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    "$WHEELS"/*.whl >>"$LOG" 2>&1 || { echo "the carried wheels did not install" >>"$LOG"; exit 1; }
fi
export PYTHONPATH=/tmp/site:$PWD/src
# hpctrain's console script as pip writes it: without the __main__ guard every process a
# spawn pool starts would run the command again
if ! command -v hpctrain >/dev/null; then
  EXE=$("$PY" -c 'import sys; print(sys.executable)'); BIN=$(dirname "$EXE")
  GUARD='if __name__ == "__main__":\n    sys.exit(entry())\n'
  printf "#!%s\nimport sys\nfrom hpctrain.console import entry\n$GUARD" "$EXE" \
    >"$BIN/hpctrain" && chmod +x "$BIN/hpctrain"
fi
nvidia-smi -L >>"$LOG" 2>&1 || echo "no nvidia-smi here" >>"$LOG"
# issue 56, first: autotune's pick against the recipe as given, ResNet-50 at 224 px from a
# JPEG pack (3,000 noisy 320 x 256 images of 10 classes, 30 KB each: 0.37 bytes a pixel,
# ImageNet's about 0.8) and GPT-124M at 1,024 tokens; each trial's step time, samples/s, data
# wait and MFU are in autotune.json, the table in the log
MAKE_JPEGS='import numpy as np, pathlib, PIL.Image as I
r = np.random.default_rng(0); y, x = np.mgrid[0:256, 0:320] / 256
for split, n in (("train", 280), ("val", 20)):
    for c in range(10):
        d = pathlib.Path("/tmp/jpegs", split, f"c{c}"); d.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            a = r.uniform(0, 6, 3)
            p = np.stack([np.sin(a[k] * x + c + k * y) for k in range(3)], -1)
            p = np.clip((p + 1) * 120 + r.normal(0, 12, p.shape), 0, 255).astype(np.uint8)
            I.fromarray(p).save(d / f"{i}.jpg", quality=90)'
step jpeg-pack 60 bash -c "\"$PY\" -c '$MAKE_JPEGS' && hpctrain pack /tmp/jpegs /tmp/jpegpack"
step autotune-resnet50 170 hpctrain autotune imagenet-resnet50 data.dataset=shards \
  data.path=/tmp/jpegpack output_dir=/tmp/autotune --budget 150s --dir /tmp/autotune/r50
step autotune-gpt124m 140 hpctrain autotune tiny-lm model.name=hpctrain:gpt_124m \
  data.tokens.seq_len=1024 train.batch_size=16 output_dir=/tmp/autotune --budget 120s \
  --dir /tmp/autotune/gpt
for name in r50 gpt; do cp "/tmp/autotune/$name/autotune.json" "$OUT/autotune-$name.json" \
  2>/dev/null; done
step gpu-tests 150 "$PY" -m pytest -m gpu -q -p no:cacheprovider -ra --tb=short tests/gpu/test_gpu.py
step lm-124m 100 "$PY" benchmarks/lm_overhead.py --model hpctrain:gpt_124m --seq-len 1024 \
  --batch-size 16 --precision bf16 --compile true --rounds 2 --steps 20
step lightning 120 "$PY" benchmarks/lightning_step.py --model torchvision:resnet50 \
  --image-size 224 --batch-size 256 --precision bf16 --channels-last true --compile true \
  --rounds 2 --steps 10
step run-default 90 hpctrain run output_dir=/tmp/runs
# issue 55: where the run's GPU-seconds went, on a real board
RUN=$(ls -td /tmp/runs/*/ 2>/dev/null | head -1)
[ -n "$RUN" ] && step goodput 20 hpctrain goodput "$RUN" \
  && cp "$RUN/summary.json" "$OUT/default_summary.json"
step fused-eval 60 "$PY" benchmarks/fused_eval.py --compile
# issue 68: a requeued compiled run, its kernels (Triton's among them) kept with the run
step compile-restart 150 "$PY" benchmarks/compile_restart.py --steps 20
# issue 68: the launch-bound default recipe eager, compiled, and with CUDA graphs
step cuda-graphs 150 "$PY" benchmarks/cuda_graphs.py --steps 300
# issue 55: a large model's asynchronous save, its blocking part and the steps' dip apart
step async-save 120 hpctrain run gpt-1b parallel.tensor=1 parallel.sequence_parallel=false \
  model.activation_checkpointing=true checkpoint.async_save=true checkpoint.every_steps=20 \
  train.max_steps=100 output_dir=/tmp/async run_name=async
[ -d /tmp/async/async ] && step async-goodput 20 hpctrain goodput /tmp/async/async
step throughput 150 "$PY" benchmarks/gpu_throughput.py --table images --steps 30 --warmup 10
step fp8-table 150 "$PY" benchmarks/gpu_throughput.py --table transformer --steps 10 --warmup 5
step mem-accuracy 90 "$PY" benchmarks/memory_accuracy.py --device cuda --scale 4
step profile 60 hpctrain profile default output_dir=/tmp/prof --steps 5
TRACE=$(ls /tmp/prof/*/profile/trace.rank0.json.gz 2>/dev/null | head -1)
[ -n "$TRACE" ] && step hta 40 "$PY" benchmarks/trace_analysis.py --megabytes 0 \
  --hta "$PY" --trace "$TRACE"
step run-tiny-lm 90 hpctrain run tiny-lm output_dir=/tmp/runs
step run-pointnet 90 hpctrain run pointnet output_dir=/tmp/runs
step solve 60 hpctrain bench solve --size 8192 --device cuda --precisions fp16,bf16,tf32,fp32
step decode-gpu 60 hpctrain bench data default data.images.decode=gpu --model
step decode-cpu 60 hpctrain bench data default data.images.decode=cpu --model
# issue 40: your own tensors under bf16 and deterministic mode (segmentation counts by sorting)
TENSORS=tests/fixtures/tensor_data.py
step tensors-seg 60 hpctrain run default task=segmentation model.name=$TENSORS:pixel_net \
  data.dataset=$TENSORS:levels deterministic=true precision=bf16 optim.lr=0.03 \
  output_dir=/tmp/runs
step tensors-regression 60 hpctrain run default task=regression model.name=$TENSORS:mlp \
  data.dataset=$TENSORS:linear16 precision=bf16 optim.name=adamw optim.lr=0.01 \
  output_dir=/tmp/runs
# issue 53: variable-length batches, bucketed against random, compiled by default there
step bucketing 90 "$PY" benchmarks/bucketing.py --device cuda --median 200 --longest 1024
echo "=== done at $(( $(date +%s) - T0 ))s" >>"$LOG"
