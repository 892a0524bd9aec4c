"""The report page in a real headless Chromium: no console errors, no network requests, every
chart drew its data, a point's tooltip reads back, the axis switch works; of the default
run, of a resumed run (its restart marked) and of three runs overlaid.

Here the tests that need no training run, no process and no server; the others are
tests/runs/test_report.py."""


import pytest



def test_report_refuses_what_is_not_a_run(tmp_path, run_cli):
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli("report", str(tmp_path / "empty"))
    assert code == 2 and "no metrics.jsonl or summary.json" in err


@pytest.mark.parametrize("points", [[(7, 2.3)], [(1, 2.3), (2, 2.1)], [(0, 1.0)]])
def test_a_run_that_logged_once_or_twice_shows_its_points_to_its_last_step(points):
    """One or two logged points: each drawn, the last at the plot's right edge (the axis
    ends at the last step), steps labelled in whole numbers, a single value mid-height."""
    from hpctrain.report.chart import HEIGHT, LEFT, RIGHT, TOP, BOTTOM, WIDTH, Chart, Line, place
    placed = place(Chart("loss", "step", [Line("train", "#000", [(x, y, f"{y}")
                                                               for x, y in points])]))
    assert len(placed.points) == len(points)
    right = LEFT + (WIDTH - LEFT - RIGHT) * (points[-1][0] > 0)
    assert placed.points[-1][0] == pytest.approx(right)
    labels = [text for _, _, text, anchor in placed.texts if anchor == "middle" and text != "step"]
    assert labels and all(label.isdigit() for label in labels)
    if len(points) == 1:
        assert placed.points[0][1] == pytest.approx(TOP + (HEIGHT - TOP - BOTTOM) / 2)


def test_each_figure_is_one_curve_of_the_report():
    """A task's own curve for a figure every run draws (val_loss: a LightningModule's and,
    since issue 53, a classifier's) drew its points twice, one line over the other."""
    from hpctrain.report.series import CURVES

    keys = [(kind, key) for _, _, kind, key in CURVES]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)
