"""`hpctrain autotune RECIPE`: the fastest settings for a run on this machine, measured.

`knobs.py` says what may change (each setting's candidates, on this device, for this recipe),
`trials.py` measures one candidate as a short real run in a process of its own, `search.py`
chooses which candidates to measure within the budget and weighs one-time costs against the
run's length, `results.py` writes what was found (the tuned recipe, every trial).
"""
