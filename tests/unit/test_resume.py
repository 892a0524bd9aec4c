"""Resume does what it says: the tests that need no training run, no process and no server (the
others are tests/runs/test_resume.py)."""



from hpctrain.train.checkpoints.progress_state import PROGRESS_RULES, Progress


def test_the_rules_cover_every_field_of_the_progress():
    import dataclasses

    assert set(PROGRESS_RULES) == {f.name for f in dataclasses.fields(Progress)}
