"""`hpctrain watch`: one run followed from its directory while it trains and after it ends;
what cannot be followed is exit 2.

Here the tests that need no training run, no process and no server; the others are
tests/runs/test_watch.py."""


from hpctrain.runs.watch import sparkline


def test_sparklines_span_the_lowest_to_the_highest_value():
    assert sparkline([1.0, 2.0, 3.0, None, 4.0]) == "▁▃▆█"  # eighths of the range
    assert sparkline([5.0, 5.0]) == "▁▁" and sparkline([]) == ""
    assert len(sparkline(list(range(100)))) == 40


def test_what_cannot_be_watched_is_exit_2(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    code, _, err = run_cli("watch", "424242")
    assert code == 2 and "job 424242: not in the job ledger" in err
    code, _, err = run_cli("watch", "no-such-run", "--db", str(tmp_path / "i.sqlite"))
    assert code == 2 and "no run 'no-such-run'" in err


def test_a_run_whose_summary_says_a_status_of_no_run_or_pruned_is_seen_as_ended(run_cli,
                                                                                tmp_path):
    """Not followed for ever (before: a status `watch` did not know, a search's pruned trial
    among them, was neither running nor ended, and `watch` waited on it without end)."""
    import json

    from hpctrain.runs.watch import snapshot

    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps(
        {"kind": "train", "step": 2, "time": 1795600000.0, "loss": 1.0}) + "\n")
    for status, seen in (("pruned", "pruned"), ("sleeping", "damaged")):
        (run / "summary.json").write_text(json.dumps({"status": status, "steps": 2}))
        shot = snapshot(run)
        assert (shot.status, shot.ended) == (seen, True), status
    assert "status is \"sleeping\", not one of completed, failed" in shot.damage
    code, out, _ = run_cli("watch", str(run))  # no --once: it returns, the run has ended
    assert code == 0 and "damaged" in out
