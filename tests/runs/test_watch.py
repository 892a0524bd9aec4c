"""`hpctrain watch`: the tests that train, in this process or in an `hpctrain` process of their
own (the others are tests/unit/test_watch.py)."""

import json
from pathlib import Path



def test_watch_follows_a_run_while_it_trains_and_ends_with_it(tiny_config, run_cli, capsys,
                                                              tmp_path, monkeypatch):
    from hpctrain.train.loop import train

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    seen = []

    def look(parts, step):
        if step == 6:
            capsys.readouterr()
            seen.append(run_cli("watch", str(parts.run_dir), "--once", "--json"))
    summary = train(tiny_config("train.max_steps=10", "run_name=watched"), on_step=look)
    (code, out, _), = seen
    shot = json.loads(out)
    assert code == 0 and shot["status"] == "running" and shot["step"] == 6
    assert shot["total_steps"] == 10 and shot["eta_seconds"] is not None
    assert len(shot["loss_spark"]) == 3 and shot["throughput"] > 0  # records at 2, 4, 6
    capsys.readouterr()
    code, out, _ = run_cli("watch", summary["run_dir"])  # ended: one reading, no waiting
    assert code == 0 and "completed, step 10/10" in out and "val_accuracy" in out


def test_watch_ends_on_a_finished_run_whose_summary_is_missing_or_damaged(tiny_config, tmp_path,
                                                                           monkeypatch):
    """No process holds the run (its lock is gone): watch says how it stands and ends, where
    it waited for good before."""
    from conftest import run_installed
    from hpctrain.train.loop import train

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    run_dir = Path(train(tiny_config("train.max_steps=4", "run_name=cut"))["run_dir"])
    summary = run_dir / "summary.json"
    summary.unlink()
    done = run_installed("watch", str(run_dir), "--every", "0.2", timeout=120)
    assert done.returncode == 0 and "ended without a summary, step 4" in done.stdout
    summary.write_text('{"status": "comp')
    done = run_installed("watch", str(run_dir), "--every", "0.2", timeout=120)
    assert done.returncode == 0 and "damaged, step 4" in done.stdout
    assert "damaged: summary.json" in done.stdout
