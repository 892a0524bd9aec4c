"""Resume does what it says: one line of history, the right run, the settings that are asked
for, damage named and worked around, a finished run left alone, nothing run from the files.

Here the tests that train, in this process or in an `hpctrain` process of their own; the
others are tests/unit/test_resume.py."""

import json
import shutil

import pytest
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner

from hostile import DAMAGE, META_DAMAGE, edit_meta, plant_hostile_index, plant_hostile_value
from hpctrain.runs.directory import list_checkpoints
from hpctrain.train.checkpoints.checkpoint import read_checkpoint
from hpctrain.train.checkpoints.safe_checkpoint import DamagedCheckpoint, problem


def steps(run_dir) -> list[int]:
    return [int(c.name.split("_")[1]) for c in list_checkpoints(run_dir / "checkpoints")]


def records(run_dir, kind="train") -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_resuming_an_older_checkpoint_sets_the_later_branch_aside(tmp_path, run_cli, tiny):
    base = tiny("run_name=branchy", "checkpoint.every_steps=5", "checkpoint.keep_last=2")
    assert run_cli("run", "default", *base, "train.max_steps=20")[0] == 0
    run = tmp_path / "runs" / "branchy"
    assert steps(run) == [15, 20]
    code, out, _ = run_cli("run", "default", *base, "checkpoint.every_steps=1",
                           f"resume={run}/checkpoints/step_00000015", "train.max_steps=17")
    assert code == 0 and "set aside step_00000020" in out
    assert steps(run) == [16, 17]  # retention saw one history: 20 is not mixed in
    aside, = run.glob("checkpoints/set-aside-*")
    assert (aside / "step_00000020" / "meta.json").is_file()
    assert "another branch" in json.loads((aside / "why.json").read_text())["step_00000020"]
    assert max(r["step"] for r in records(run)) == 17  # the old branch's metrics left too
    assert {r["step"] for r in map(json.loads, (aside / "metrics.jsonl").read_text()
                                   .splitlines())} >= {20}
    code, out, _ = run_cli("run", "default", *base, "resume=auto", "train.max_steps=19")
    assert code == 0 and "(resuming step_00000017)" in out
    assert json.loads((run / "summary.json").read_text())["steps"] == 19


def test_resume_auto_takes_only_runs_of_the_same_recipe(tmp_path, run_cli, tiny):
    from hpctrain.config import shipped_recipes

    other = tmp_path / "default-v2.yaml"
    shutil.copy(shipped_recipes()["default"], other)
    assert run_cli("run", str(other), *tiny("train.max_steps=4"))[0] == 0
    code, out, _ = run_cli("run", "default", *tiny("resume=auto", "train.max_steps=4"))
    assert code == 0 and "resuming" not in out  # default-v2's run is not default's
    assert sorted(p.name.rsplit("-", 2)[0] for p in (tmp_path / "runs").iterdir()) == \
        ["default", "default-v2"]


def test_a_changed_learning_rate_is_what_trains_after_the_resume(tmp_path, run_cli, tiny):
    base = tiny("run_name=lr", "schedule.name=constant", "train.log_every=1")
    assert run_cli("run", "default", *base, "train.max_steps=4")[0] == 0
    code, out, _ = run_cli("run", "default", *base, "resume=auto", "train.max_steps=8",
                           "optim.lr=0.05")
    assert code == 0 and "optim.lr: 0.2 -> 0.05" in out
    run = tmp_path / "runs" / "lr"
    assert [r["lr"] for r in records(run)] == [0.2] * 4 + [0.05] * 4
    summary = json.loads((run / "summary.json").read_text())
    assert summary["effective_lr"] == 0.05
    assert summary["resumed_with_changes"][-1]["step"] == 4
    assert "optim.lr: 0.2 -> 0.05" in summary["resumed_with_changes"][-1]["settings"]
    assert records(run, "resume")[-1]["changes"] == summary["resumed_with_changes"][-1]["settings"]


@pytest.mark.parametrize("change, words", [
    ("model.name=hpctrain:resnet_small", "model.name is 'hpctrain:resnet_small' here but "
                                         "'hpctrain:tiny_cnn' in the checkpoint"),
    ("model.kwargs={width: 12}", "model.kwargs is {'width': 12} here but {}"),
    ("optim.name=adamw", "optim.name is 'adamw' here but 'sgd'"),
    ("optim.ema.enabled=true", "the checkpoint holds no EMA weights"),
    ("data.dataset=synthetic", "does not fit this run's model or optimiser"),
])
def test_a_resume_that_cannot_fit_the_checkpoint_names_the_setting(tmp_path, run_cli, tiny,
                                                                  change, words):
    base = tiny("run_name=fixed", "train.max_steps=2")
    assert run_cli("run", "default", *base)[0] == 0
    code, _, err = run_cli("run", "default", *base, "resume=auto", "train.max_steps=4",
                           change, "data.synthetic.num_classes=7")
    assert code == 2 and words in err and "Traceback" not in err
    if change.startswith("data."):
        assert "data.dataset: 'shapes' -> 'synthetic'" in err
    assert steps(tmp_path / "runs" / "fixed") == [2]  # nothing was touched


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, run_cli, tiny,
                                                                    damage):
    base = tiny("run_name=hurt", "checkpoint.every_steps=5")
    assert run_cli("run", "default", *base, "train.max_steps=10")[0] == 0
    run = tmp_path / "runs" / "hurt"
    spoil, words = DAMAGE[damage]
    spoil(run / "checkpoints" / "step_00000010")
    code, out, _ = run_cli("run", "default", *base, "resume=auto", "train.max_steps=12")
    assert code == 0 and "(resuming step_00000005)" in out
    assert "set aside step_00000010" in out and words in out
    assert steps(run) == [5, 10, 12]
    aside, = run.glob("checkpoints/set-aside-*")
    assert words in json.loads((aside / "why.json").read_text())["step_00000010"]


def test_every_field_a_resume_relies_on_in_meta_json_is_checked(tmp_path, run_cli, tiny):
    assert run_cli("run", "default", *tiny("run_name=fields", "train.max_steps=2"))[0] == 0
    whole = tmp_path / "runs" / "fields" / "checkpoints" / "step_00000002"
    assert problem(whole) is None
    for name, (change, words) in META_DAMAGE.items():
        copy = tmp_path / name / "step_00000002"
        shutil.copytree(whole, copy)
        edit_meta(copy, change)
        assert words in (problem(copy) or ""), name


def test_no_whole_checkpoint_or_a_damaged_one_asked_for_is_named(tmp_path, run_cli, tiny):
    base = tiny("run_name=ruined", "checkpoint.every_steps=5")
    assert run_cli("run", "default", *base, "train.max_steps=10")[0] == 0
    run = tmp_path / "runs" / "ruined"
    DAMAGE["truncated shard"][0](run / "checkpoints" / "step_00000010")
    code, _, err = run_cli("run", "default", *base,
                           f"resume={run}/checkpoints/step_00000010")
    assert code == 2 and "step_00000010" in err and "truncated" in err
    DAMAGE["empty meta.json"][0](run / "checkpoints" / "step_00000005")
    code, _, err = run_cli("run", "default", *base, "resume=auto", "train.max_steps=12")
    assert code == 2 and "every checkpoint of" in err
    assert "step_00000005" in err and "step_00000010" in err and "Traceback" not in err
    assert steps(run) == [5, 10]  # nothing moved or deleted


def test_a_checkpoint_index_that_runs_a_command_is_refused(tmp_path, run_cli, tiny):
    base = tiny("run_name=planted", "train.max_steps=2")
    assert run_cli("run", "default", *base)[0] == 0
    checkpoint = tmp_path / "runs" / "planted" / "checkpoints" / "step_00000002"
    marker = tmp_path / "pwned"
    plant_hostile_index(checkpoint, marker)
    code, _, err = run_cli("run", "default", *base, "resume=auto", "train.max_steps=4")
    assert code == 2 and ".metadata is not a checkpoint index" in err
    assert "names posix.system" in err or "names os.system" in err
    with pytest.raises(DamagedCheckpoint):
        read_checkpoint(checkpoint)
    assert not marker.exists()


def test_a_checkpoint_value_that_runs_a_command_is_refused(tmp_path, run_cli, tiny):
    base = tiny("run_name=planted", "train.max_steps=2")
    assert run_cli("run", "default", *base)[0] == 0
    checkpoint = tmp_path / "runs" / "planted" / "checkpoints" / "step_00000002"
    marker = tmp_path / "pwned"
    name = plant_hostile_value(checkpoint, marker)
    code, _, err = run_cli("run", "default", *base, "resume=auto", "train.max_steps=4")
    assert code == 2 and f"checkpoint value {name!r} is not plain data" in err
    with pytest.raises(DamagedCheckpoint, match="not plain data"):
        read_checkpoint(checkpoint)
    assert not marker.exists()
    # the threat is real: DCP's own planner runs it
    dcp.load({}, storage_reader=FileSystemReader(checkpoint),
             planner=_EmptyStateDictLoadPlanner())
    assert marker.exists()


def test_a_finished_run_is_left_as_it_is(tmp_path, run_cli, tiny):
    base = tiny("run_name=done", "train.max_steps=3")
    assert run_cli("run", "default", *base)[0] == 0
    run = tmp_path / "runs" / "done"
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    code, out, _ = run_cli("run", "default", *base, "resume=auto")
    assert code == 0 and "is already complete (step 3 of 3)" in out
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
