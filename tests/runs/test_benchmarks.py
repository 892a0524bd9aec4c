"""Every script in benchmarks/ runs, at a tiny size, on this machine: a change that breaks one
fails here rather than on the first GPU node it meets. The figures themselves are not checked
(speed lives in docs/benchmarks.md); the table each script prints is."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import write_image_folder

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
TINY_IMAGES = ["--model", "hpctrain:tiny_cnn", "--image-size", "16"]

# script, tiny arguments, lines the printed table must hold (regular expressions)
CASES = [
    ("engine_overhead.py", [*TINY_IMAGES, "--batch-size", "8", "--steps", "2", "--rounds", "2"],
     [r"hand-written PyTorch\s+[\d.]+\s+\d+\s+1\.000", r"hpctrain\s+[\d.]+\s+\d+\s+[\d.]+"]),
    ("gpu_throughput.py", ["--device", "cpu", "--table", "images", *TINY_IMAGES, "--batch-size",
                           "4", "--steps", "1", "--warmup", "1", "--rows", "1,3,4,5"],  # 2: tf32
     [r"^fp32\s+\d+\s+(n/a|[\d.]+%)\s+1\.00", r"^bf16 \+ channels_last \+ compile\s+\d+"]),
    ("gpu_throughput.py", ["--device", "cpu", "--table", "transformer", "--gpt", "tiny",
                           "--seq-len", "32", "--gpt-batch-size", "2", "--steps", "1",
                           "--warmup", "1"],
     [r"^bf16 \+ compile\s+\d+\s+(n/a|[\d.]+%)\s+1\.00",
      r"^fp8 rowwise \+ compile\s+-.*not measured: precision=fp8 needs a GPU"]),
    ("fused_eval.py", ["--device", "cpu", "--model", "hpctrain:tiny_cnn", "--image-size", "16",
                       "--batch-size", "8", "--batches", "2", "--rounds", "1"],
     [r"^plain\s+[\d.]+\s+\d+\s+1\.00", r"^conv\+BN folded\s+[\d.]+\s+\d+\s+[\d.]+",
      r"largest logit difference (\d\.\d\de-(0[5-9]|1\d)|0\.00e\+00); accuracies equal"]),
    ("ddp_overlap.py", [*TINY_IMAGES, "--batch-size", "8", "--steps", "2", "--rounds", "1"],
     [r"^1\s+[\d.]+\s+\d+\s+1\.00", r"^2\s+[\d.]+\s+\d+\s+[\d.]+\s+[\d.]+\s+\d+%"]),
    ("memory_accuracy.py", ["--models", "resnet18", "--image-size", "32", "--precisions", "bf16",
                            "--checkpointing", "yes"],
     [r"\| resnet18 \| 16 \| bf16 \| yes \| .* \| [\d.]+ \|", r"worst relative error"]),
    ("activation_formula.py", ["--cases", "tiny"],
     [r"\| tiny \| 32 \| 64 \| 128 \| 4 \| 2 \| yes \| flash or cuDNN \| .* \| [\d.]+ \| [\d.]+ \|"]),
    ("memory_accuracy.py", ["--predict-only", "--models", "gpt"],
     [r"\| gpt \| 4 \| bf16 \| yes \| [\d.]+ \w+ \| [\d.]+ \w+ \| [\d.]+ \|"]),
    ("sequence_padding.py", ["--documents", "300", "--batch-size", "4", "--seq-len", "256",
                             "--workers", "1", "--seconds", "0.2"],
     [r"^blocks \(hpctrain's default\)\s+1\.000\s+1\.000\s+[\d,]+",
      r"^documents, length-bucketed \(hpctrain\)\s+1\.\d+\s+[\d.]+\s+[\d,]+",
      r"^documents padded to the context\s+[\d.]+\s+[\d.]+\s*$"]),
    ("bucketing.py", ["--samples", "128", "--epochs", "1", "--batch-size", "16", "--width",
                      "16", "--layers", "1"],
     [r"^random batches\s+[\d.]+%\s+[\d,]+\s+[\d.]+\s+1\.00",
      r"^data\.bucketing\s+[\d.]+%\s+[\d,]+\s+[\d.]+\s+[\d.]+"]),
    ("trace_analysis.py", ["--megabytes", "2", "--part-megabytes", "0.5"],
     [r"\| \(b\) hpctrain analysis, one process \| [\d.]+ \|",
      r"\| \(c\) hpctrain analysis, \d+ processes \(the default\) \| [\d.]+ \|",
      r"\| \(d\) the same, the trace gzip-compressed \| [\d.]+ \|",
      r"\(c\)/\(b\): time [\d.]+x; pieces of at least 0.5 MB"]),
    ("stop_latency.py", ["--widths", "8,8", "--presses", "1"],
     [r"^8,8\s+[\d.]+\s+[\d.]+\s+0\.\d+", r"^1\s+[\d.]+\s+0\.\d+$"]),
    ("lightning_step.py", [*TINY_IMAGES, "--batch-size", "8", "--steps", "2", "--rounds", "2"],
     [r"^Lightning Trainer\s+[\d.]+\s+\d+\s+1\.000", r"^hpctrain\s+[\d.]+\s+\d+\s+[\d.]+",
      r"^hand-written PyTorch\s+[\d.]+\s+\d+\s+[\d.]+"]),
    ("hf_trainer_step.py", ["--texts", "120", "--hidden", "32", "--steps", "6", "--log-every",
                            "2", "--rounds", "1"],
     [r"^Hugging Face Trainer\s+[\d.]+\s+\d+\s+1\.000", r"^hpctrain\.fit\s+[\d.]+\s+\d+\s+[\d.]+"]),
    ("lm_overhead.py", ["--batch-size", "4", "--seq-len", "16", "--steps", "2", "--rounds", "2"],
     [r"hand-written nanoGPT\s+[\d.]+\s+\d+\s+1\.000", r"^hpctrain\s+[\d.]+\s+\d+\s+[\d.]+"]),
    ("host_memory.py", ["--recipes", "pointnet", "--steps", "2", "--set=data.num_workers=0",
                        "--set=data.shapes3d.num_train=40", "--set=data.shapes3d.num_val=10",
                        "--set=data.points.num_points=64", "--set=train.batch_size=4"],
     [r"^pointnet\s+glibc default\s+[\d.]+\s+1\.00", r"^pointnet\s+kept \(hpctrain\)\s+[\d.]+"]),
    ("pipeline_bubble.py", ["--microbatches", "2", "--width", "32", "--layers", "2",
                            "--seq-len", "16", "--batch-size", "4", "--steps", "1",
                            "--rounds", "1"],
     [r"^2\s+1f1b\s+[\d.]+\s+[\d.]+\s+-?[\d.]+\s+0\.33\s+-?[\d.]+",
      r"tensor parallelism over 2: [\d.]+ ms/step .* 14 all-reduces of activations per step "
      r"\(the plan: 14\)"]),
    ("runs_index.py", ["--runs", "20", "200"],
     [r"^full scan\s+SQLite\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+-?[\d.]+$",
      r"^refresh, 1 % restarted\s+PostgreSQL\s+[\d.]+", r"^leaderboard to 0\.8\s+SQLite",
      r"^runs \(listing as shown\)\s+SQLite", r"^peak memory added \(MB\)\s+PostgreSQL"]),
    ("checkpoint_interval.py", ["--work", "2", "--runs", "5"],
     [r"^best fixed interval \(sweep\)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+1\.000",
      r"^auto \(Daly\)\s+7\.4\s+[\d.]+\s+[\d.]+\s+[\d.]+",
      r"^every epoch \(today's default\)\s+60\.0\s+[\d.]+"]),
    ("checkpoint_interval_slurm.py", ["--policies", "auto", "--steps", "20", "--seeds", "1",
                                      "--mtbf", "1000"],
     [r"^auto\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+0\.0\s+1\.000$",
      r"^no fixed interval; best: auto$"]),
    ("goodput_overhead.py", ["--step-ms", "10", "--jobs", "2", "--records", "10"],
     [r"^per step: the progress beat\s+[\d.]+\s+[\d.]+\s+[\d.]+%\s+[\d.]+$",
      r"^per s: progress.json rewritten\s+[\d.]+",
      r"^per step: a save in flight, counted\s+[\d.]+\s+[\d.]+\s+[\d.]+%\s+[\d.]+$",
      r"^per checkpoint: run.json of 2 jobs\s+[\d.]+", r"^all of it\s+[\d.]+\s+[\d.]+%"]),
    ("worker_start.py", ["--kinds", "tensors", "--batches", "3", "--methods", "fork",
                         "forkserver"],
     [r"^tensors\s+fork\s+[\d.]+ s \(1\.00x\)", r"^tensors\s+forkserver\s+[\d.]+ s \("]),
    ("fork_stress.py", ["--starts", "40", "--methods", "forkserver", "--patience", "5"],
     [r"^forkserver\s+0\s+40\s+0\.00%\s+[\d.]+$"]),
    ("tune_search.py", ["--trials", "2", "--seeds", "1", "--series",
                        "random/none,tpe/median"],
     [r"^random, pruner none\s+[\d.]+\s+[\d.]+\s+0\.000\s+1\.000\s+0\.0\s+60\s+1\.00",
      r"^tpe, pruner median\s+[\d.]+\s+[\d.]+\s+0\.000\s+[\d.]+\s+[\d.]+\s+\d+\s+[\d.]+"]),
    ("data_pipeline.py", ["--images", "48", "--workers", "1", "--batch", "8"],
     [r"\(b\) WebDataset, same tars\s+\d+", r"\(c\) hpctrain shards\s+\d+\s+1\.00",
      r"\(c-\) shards, torch loader\s+\d+", r"\(d\) decode-only limit\s+\d+",
      r"\(f\) LitData\s+\d+", r"\(g\) MosaicML Streaming\s+\d+",
      r"^hpctrain pack\s+[\d.]+\s+1\s+\d+", r"^litdata.optimize\s+[\d.]+\s+1\s+\d+",
      r"^MDSWriter \(jpeg column\)\s+[\d.]+\s+1\s+\d+"]),
    ("data_pipeline.py", ["--photographs", "--images", "24", "--workers", "1", "--batch", "8",
                          "--rounds", "2"],
     [r"24 JPEGs \(scikit-image photographs, q90\).*median of 2 alternating",
      r"\(c\) hpctrain shards\s+\d+\s+1\.00", r"\(f\) LitData\s+\d+"]),
    ("data_pipeline.py", ["--images-from", "{tmp}/photos", "--workers", "1", "--batch", "8"],
     [r"40 JPEGs \(.*photos\)", r"\(c\) hpctrain shards\s+\d+\s+1\.00"]),
    ("slurm_queue.py", ["--sizes", "2", "4", "--repeats", "1"],
     [r"^jobs\s+[\d.]+\s+1\s+[\d.]+\s+1\s+-?[\d.]+$",
      r"^status, one array job\s+[\d.]+\s+1\s+[\d.]+\s+1\s+-?[\d.]+$"]),
    ("pack_growth.py", ["--sizes", "100", "400", "--workers", "1"],
     [r"^\s+100\s+[\d.]+\s+\d+\s+\d+$", r"^\s+exponent\s+-?[\d.]+\s+-?[\d.]+\s+-?[\d.]+$"]),
    ("tune_workers.py", ["--workers", "2", "--trials", "3", "6", "--sampler", "random"],
     [r"^journal\s+2\s+6\s+[\d.]+\s+6\s+0\s+0\s+0\s+[\d.]+\s+-?[\d.]+$",
      r"^PostgreSQL\s+2\s+6\s+[\d.]+\s+6\s+0\s+0\s+0\s+[\d.]+"]),
    ("token_loader.py", ["--tokens", "300000", "--seq-lens", "64", "--batches", "5",
                         "--rounds", "1"],
     [r"^\s+64  hpctrain pack, in-process\s+[\d,]+\s+1\.00",
      r"^\s+64  nanoGPT get_batch, in-process\s+[\d,]+\s+[\d.]+",
      r"^\s+64  LitData TokensLoader, 2 workers\s+[\d,]+\s+[\d.]+"]),
    ("data_stages.py", ["--images", "48", "--count", "20"],
     [r"^decode\s+[\d.]+\s+\d+%", r"^to the training process\s+[\d.]+",
      r"buffers loader"]),
    ("data_stages.py", ["--images", "48", "--count", "20", "--loader", "torch"],
     [r"^into the batch\s+[\d.]+", r"torch loader"]),
    ("autotune_grid.py", ["default", "data.shapes.num_train=160", "data.shapes.num_val=40",
                          "data.shapes.image_size=16", "data.images.image_size=16",
                          "model.name=hpctrain:tiny_cnn", "train.batch_size=16",
                          "train.epochs=20", "--fix", "precision", "--fix", "compile", "--fix",
                          "data.num_workers", "--fix", "train.grad_accum_steps",
                          "--warmup-steps", "2", "--measure-steps", "4", "--rounds", "1",
                          "--budget", "15s"],
     [r"^default .*: 2 candidates \(2 measured\), fixed: precision, compile",
      r"^exhaustive grid: \d+ s; autotune: \d+ trials in \d+ s \(budget 15 s\)",
      r"^the recipe as given\s+[\d,.]+\s+[\d.]+\s+-$",
      r"^autotune's pick\s+[\d,.]+\s+[\d.]+", r"^the grid's best\s+[\d,.]+\s+1\.000"]),
    ("compile_restart.py", ["--steps", "2", "--set", "model.name=hpctrain:tiny_cnn",
                            "data.shapes.num_train=64", "data.shapes.num_val=16",
                            "data.shapes.image_size=16", "data.images.image_size=16",
                            "train.batch_size=16", "data.num_workers=0"],
     [r"^cold start \(a new run\)(\s+[\d.]+){7}\s+1\.00$",
      r"^requeued, cache kept \(shared\)(\s+[\d.]+){5}\s+0\.0\s+[\d.]+\s+[\d.]+$",
      r"^a new run in the same output folder(\s+[\d.]+){2}\s+0\.0(\s+[\d.]+){2}\s+0\.0\s+"
      r"[\d.]+\s+[\d.]+$"]),
    ("cuda_graphs.py", ["--steps", "4", "--set", "model.name=hpctrain:tiny_cnn",
                        "data.shapes.num_train=64", "data.shapes.num_val=16",
                        "data.shapes.image_size=16", "data.images.image_size=16",
                        "train.batch_size=16", "data.num_workers=0", "train.log_every=2"],
     [r"^eager\s+[\d,]+\s+[\d.]+\s+eager$",
      r"^compiled, default mode\s+[\d,]+\s+1\.00\s+default, \d+ graphs$",
      # on a CPU, CUDA graphs asked for run as the default mode (the run's header says so)
      r"^compiled, CUDA graphs\s+[\d,]+\s+[\d.]+\s+default, \d+ graphs$"]),
    ("warm_starts.py", ["--rounds", "1"],
     [r"^cold \(a fresh interpreter\)\s+[\d.]+\s+1\.00$",
      r"^warm \(forked from it\)\s+[\d.]+\s+[\d.]+$"]),
]


def test_every_benchmark_script_has_a_smoke_case():
    """Every script (a module run as __main__; harness.py and peer_loaders.py are helpers the
    scripts import)."""
    assert {script for script, _, _ in CASES} == \
        {p.name for p in BENCHMARKS.glob("*.py") if '__name__ == "__main__"' in p.read_text()}


@pytest.mark.slow
@pytest.mark.parametrize("script, arguments, expected", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_a_benchmark_runs_at_a_tiny_size(script, arguments, expected, tmp_path):
    if script in ("data_pipeline.py", "data_stages.py", "stop_latency.py", "host_memory.py",
                  "lm_overhead.py", "sequence_padding.py", "runs_index.py", "tune_search.py",
                  "token_loader.py", "pack_growth.py", "tune_workers.py",
                  "checkpoint_interval_slurm.py", "warm_starts.py", "compile_restart.py",
                  "cuda_graphs.py"):
        arguments = [*arguments, "--cache-dir", str(tmp_path)]
    if "{tmp}/photos" in arguments:  # a user's own photographs, in ImageFolder layout
        write_image_folder(tmp_path / "photos", per_class=20, size=64)
        arguments = [a.replace("{tmp}", str(tmp_path)) for a in arguments]
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *arguments],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    for pattern in expected:
        assert re.search(pattern, done.stdout, re.MULTILINE), (pattern, done.stdout)


def test_memory_accuracy_names_a_case_word_it_does_not_know(tmp_path):
    done = subprocess.run([sys.executable, str(BENCHMARKS / "memory_accuracy.py"),
                           "--precisions", "bf16,fp16"], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines()[-1] == (
        "memory_accuracy.py: error: argument --precisions: 'bf16,fp16': comma-separated words "
        "of fp32, bf16")


@pytest.mark.slow
def test_the_gpu_batch_runs_its_steps_in_order_and_skips_what_its_deadline_leaves_out(
        tmp_path):
    """benchmarks/owed_on_gpu.sh here, with 18 s and two of its steps (its first ones make a
    JPEG pack and autotune on it, minutes on this CPU): the GPU tests run (skipped without
    CUDA, some 5 s), the later step finds under the 15 s a step needs left, is skipped by the
    deadline and said so, and the log ends. (With 25 s the next step ran until the deadline
    killed it: 20 s of the suite spent waiting.)"""
    root = BENCHMARKS.parent
    steps = re.findall(r"^step ([\w-]+)", (BENCHMARKS / "owed_on_gpu.sh").read_text(), re.M)
    assert steps[:4] == ["jpeg-pack", "autotune-resnet50", "autotune-gpt124m", "gpu-tests"]
    done = subprocess.run(["bash", str(BENCHMARKS / "owed_on_gpu.sh")], cwd=root,
                          env={**os.environ, "BUDGET": "18", "OUT": str(tmp_path),
                               "ONLY": "gpu-tests decode-cpu",
                               "WHEELS": str(tmp_path / "no-wheels"),
                               "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "all.log").read_text()
    assert re.search(r"=== gpu-tests rc=0 after \d+s", log), log
    assert "=== SKIPPED decode-cpu (no time left)" in log and "=== done at" in log
    # ONLY names the steps a second call finishes: the others are not even announced
    only = tmp_path / "only"
    done = subprocess.run(["bash", str(BENCHMARKS / "owed_on_gpu.sh")], cwd=root,
                          env={**os.environ, "BUDGET": "10", "OUT": str(only),
                               "ONLY": "decode-cpu", "WHEELS": str(tmp_path / "no-wheels"),
                               "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=60)
    log = (only / "all.log").read_text()
    assert done.returncode == 0 and "=== SKIPPED decode-cpu (no time left)" in log, log
    assert "gpu-tests" not in log and "run-default" not in log, log
