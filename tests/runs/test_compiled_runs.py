"""Compiled runs (issue 68): a run keeps what torch compiled, so that a job stopped and started
again loads its kernels instead of compiling them, and ends with the same weights as a run
never stopped (how much sooner it reaches its first step is benchmarks/compile_restart.py's);
a run that keeps compiling again is told why and what to do."""

import json
import os
import random
import re
import signal
import subprocess
import sys

import pytest

from torch import nn
from torch.utils.data import DataLoader

import hpctrain
from launching import launch, one_thread_env, records, wait_for_step
from recipes import FIXTURES
from hpctrain.data.tokens.token_packing import TokenPackOptions, pack_tokens
from training_state import assert_same_training_state, final_state

sys.path.insert(0, str(FIXTURES))
from widths import Specialising, Widths, pad  # noqa: E402


def starts(run) -> list[dict]:
    return json.loads((run / "run.json").read_text())["starts"]


def test_a_requeued_compiled_run_loads_its_kernels_and_ends_with_the_same_weights(tmp_path,
                                                                                 tiny):
    """Stopped by SIGTERM after its first evaluation (every graph compiled), resumed to a few
    steps on; a constant LR, so that the length the runs are given changes nothing else."""
    settings = ("compile=true", "schedule.name=constant", "optim.lr=0.05", "optim.ema.enabled=true")
    stopped = tmp_path / "runs" / "stopped"
    # one thread, as launch's jobs below: Inductor's CPU kernels are made for a thread count
    process = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "run", "default",
         *tiny(*settings, "train.max_steps=100000", "run_name=stopped")],
        start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=one_thread_env())
    wait_for_step(stopped, 12, process, timeout=300)  # 10 steps an epoch: evaluated once
    os.killpg(process.pid, signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 75, err[-3000:]
    end = f"train.max_steps={json.loads((stopped / 'summary.json').read_text())['steps'] + 6}"

    again = launch(1, tiny(*settings, end, "run_name=stopped", "resume=auto"))
    assert again.returncode == 0, again.stderr[-3000:]
    folders = list((stopped.parent / ".compile-cache").iterdir())  # the output folder's
    assert len(folders) == 1 and folders[0].name.startswith("torch")  # one machine's key
    assert f"compiled kernels: kept in {folders[0]}" in again.stdout
    assert "compile True (default)" in again.stdout  # auto's mode on a CPU: no CUDA graphs
    assert "files from earlier jobs: loaded, not compiled again" in again.stdout
    first, second = (start["split"] for start in starts(stopped))
    assert first["compile_cache_misses"] > 0 and first["compile_cache_hits"] == 0
    # every graph the requeued job needed came from the first job's kernels
    assert second["compile_cache_hits"] > 0 and second["compile_cache_misses"] == 0
    assert second["compiled_graphs"] == first["compiled_graphs"]
    assert second["resume_load"] > 0 and "resume_load" not in first
    assert second["compilation"] > 0 and second["first_step"] > second["startup"]

    # a new run never stopped, in the same output folder: it starts warm from the folder's
    # kernels (compile_cache: shared), and ends with the same weights to the bit
    whole = launch(1, tiny(*settings, end, "run_name=whole"))
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert f"compiled kernels: kept in {folders[0]}" in whole.stdout
    assert starts(stopped.parent / "whole")[0]["split"]["compile_cache_misses"] == 0
    assert_same_training_state(final_state(stopped), final_state(stopped.parent / "whole"))


def test_goodput_tells_each_job_s_way_to_its_first_step(tmp_path, tiny, run_cli):
    """A run without compile: the start-up's parts, no compilation, the first step's end."""
    code, _, err = run_cli("run", "default", *tiny("run_name=eager", "train.max_steps=2"))
    assert code == 0, err
    run = tmp_path / "runs" / "eager"
    split = starts(run)[0]["split"]
    assert split["imports"] >= 0 and split["build"] > 0 and "resume_load" not in split
    assert split["compilation"] == 0 and split["compiled_graphs"] == 0
    assert split["startup"] <= split["first_step"]
    code, out, _ = run_cli("goodput", str(run))
    assert code == 0 and "each job's way to its first step" in out
    row = next(line for line in out.splitlines() if "#1" in line)
    assert row.split("│")[6].strip() == "0.0"  # compiled nothing


def test_a_run_that_keeps_compiling_again_is_told_why_and_the_fix(tmp_path, capsys):
    """A model torch compiles once per width, given batches of six widths: the run says so
    once, with the latest reason and what to do, and its summary counts the graphs."""
    summary = hpctrain.fit(Specialising(), DataLoader(Widths(), batch_size=8, collate_fn=pad),
                           compile=True, output_dir=str(tmp_path), tensorboard=False,
                           report=False, train={"epochs": 1, "log_every": 2},
                           data={"num_workers": 0})
    out = capsys.readouterr().out
    assert out.count("hpctrain: warning: torch.compile compiled the model again") == 1
    told = next(line for line in out.splitlines() if "compiled the model again" in line)
    assert "size mismatch at index 1" in told and "pad_to_multiple_of" in told
    compiled = summary["compiled"]
    assert compiled["recompiles"] >= 5 and compiled["compiled_graphs"] >= 6  # one per width
    assert any("size mismatch" in reason for reason in compiled["latest_recompile_reasons"])


def test_a_run_whose_shapes_settle_is_not_told(tmp_path, capsys):
    """The same batches through a model that does not branch on their width: torch makes
    the width dynamic after its first change, and the evaluation's switch is one more."""
    class Mean(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.head = nn.Embedding(16, 8), nn.Linear(8, 2)

        def forward(self, ids):
            return self.head(self.embed(ids).mean(1))

    summary = hpctrain.fit(Mean(), DataLoader(Widths(), batch_size=8, collate_fn=pad),
                           compile=True, output_dir=str(tmp_path), tensorboard=False,
                           report=False, train={"epochs": 1, "log_every": 2},
                           data={"num_workers": 0})
    assert "compiled the model again" not in capsys.readouterr().out
    assert 1 <= summary["compiled"]["recompiles"] < 4


@pytest.fixture(scope="module")
def varied_pack(tmp_path_factory):
    """Documents of 1 to 30 words (a few bytes to over the context of 64): batches of many
    widths."""
    root = tmp_path_factory.mktemp("varied")
    rng = random.Random(0)
    words = "the a sum of two and three is four five six seven".split()
    for split, count in (("train", 400), ("val", 40)):
        (root / "src" / split).mkdir(parents=True)
        (root / "src" / split / "t.jsonl").write_text("".join(
            json.dumps({"text": " ".join(rng.choices(words, k=rng.randint(1, 30)))}) + "\n"
            for _ in range(count)))
    pack_tokens(root / "src", root / "pack", TokenPackOptions(), workers=1, log=lambda _: None)
    return root / "pack"


def test_documents_padded_to_width_buckets_compile_a_graph_a_width_and_train_as_eager(
        tmp_path, run_cli, varied_pack):
    """data.tokens.width_buckets=2: every batch is one of two widths, each compiled once as
    a static graph for training and once for evaluation (torch's own count), and the losses
    are eager's within compilation's rounding."""
    common = ["data.dataset=tokens", f"data.path={varied_pack}", "data.tokens.seq_len=64",
              "data.tokens.batching=documents", "data.tokens.width_buckets=2",
              "model.name=hpctrain:gpt_tiny", "model.kwargs.width=32", "model.kwargs.layers=1",
              "train.max_steps=8", "train.batch_size=8", "train.log_every=1",
              "data.num_workers=0", "tensorboard=false", "report=false",
              f"output_dir={tmp_path}"]
    losses = {}
    for name in ("eager", "compiled"):
        code, out, err = run_cli("run", "tiny-lm", *common, f"run_name={name}",
                                 f"compile={name == 'compiled'}")
        assert code == 0, err[-3000:]
        losses[name] = [r["loss"] for r in records(tmp_path / name, "train")]
    widths = {int(w) for w in out.split("documents padded to 2 widths (")[1].split(";")[0]
              .split(", ")}
    compiled = json.loads((tmp_path / "compiled" / "summary.json").read_text())["compiled"]
    assert compiled["compiled_graphs"] <= 2 * 2  # each width: training, evaluation
    # a graph made for one width was refused the other (the model's input: a width less one)
    changes = [re.search(r"size mismatch at index 1\. expected (\d+), actual (\d+)", reason)
               for reason in compiled["latest_recompile_reasons"]]
    assert any(c and {int(c[1]) + 1, int(c[2]) + 1} == widths for c in changes)
    assert losses["compiled"] == pytest.approx(losses["eager"], rel=1e-3)
