"""A run that is one trial of a search (config `trial`, written by the tune worker): rank 0
reports each evaluation to the study and asks the pruner; its answer reaches every rank, so
that a DDP trial stops together (a pruner asked on rank 0 alone leaves the other ranks
waiting in the next collective; asked on every rank, it needs the study on every rank).

The value reported is the evaluation's figure for the search's objective (val_accuracy for
best_val_accuracy), at the evaluation's number (1, 2, ...): evaluations fall on the same
share of an epoch in every trial, also when the batch size, and so the steps, differ. A
study that cannot be reached costs a warning, never the run: it then trains to the end.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from hpctrain.config import Config


class TrialPruned(Exception):
    """The study's pruner stopped this trial: the run ends with status 'pruned'."""


class TrialLink:
    def __init__(self, config: Config, distributed):
        self.distributed, self.number = distributed, config.trial.number
        self.trial = self.metric = None
        if distributed.is_main:
            self._open(Path(config.trial.study_dir))

    def _open(self, folder: Path) -> None:
        import optuna

        from hpctrain.tune.study import open_study, read_search

        try:
            search = read_search(folder)
            study = open_study(folder, search)
            frozen = study.get_trials(deepcopy=False)[self.number]
            self.trial, self.metric = optuna.trial.Trial(study, frozen._trial_id), search.metric
            self.reported = set(frozen.intermediate_values)
        except Exception as err:  # noqa: BLE001 - the run goes on without its study
            self._warn(f"cannot reach trial {self.number} of the study in {folder} ({err}); "
                       "training on without pruning")

    def prune(self, values: dict, evaluation: int, final: bool) -> bool:
        """Report the evaluation (rank 0) and return whether every rank stops now. The
        final evaluation is reported but not judged: the trial has nothing left to save, and
        it ends completed, with its value."""
        decision = False
        if self.trial is not None and self.metric is not None:
            value = values.get(self.metric)
            try:
                if value is not None and math.isfinite(value) and \
                        evaluation not in self.reported:  # a resumed trial: reported before
                    self.trial.report(value, evaluation)
                    self.reported.add(evaluation)
                decision = not final and self.trial.should_prune()
            except Exception as err:  # noqa: BLE001
                self._warn(f"trial {self.number}: reporting to the study failed ({err})")
                self.trial = None
        return bool(self.distributed.broadcast(decision))

    @staticmethod
    def _warn(text: str) -> None:
        print(f"hpctrain: warning: {text}", file=sys.stderr, flush=True)


def link(config: Config, distributed) -> TrialLink | None:
    return TrialLink(config, distributed) if config.trial.study_dir is not None else None
