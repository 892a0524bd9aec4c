"""The recipe's `data` section: what the samples are, where they come from, how they are
augmented and loaded. The settings every kind shares are here; each kind's own sections
(`data.augment`, `data.tokens`, `data.points`, ...) are its spec's (data/kinds.py).
"""

from __future__ import annotations

import difflib
from typing import Any, Literal

from pydantic import Field, PrivateAttr, create_model, field_validator, model_validator

from hpctrain import user_code
from hpctrain.data import kinds
from hpctrain.data.kind import DataKind
from hpctrain.sections import Auto, Section


class _DataSettings(Section):
    """The settings every kind shares; each kind's own sections are added below."""

    dataset: str = Field("shapes", description=f"{', '.join(kinds.BUILTIN_DATASETS)}, or "
                         "your own factory returning (train, val) Datasets: package.module:make or "
                         "path/to/file.py:make (a relative path is read from the recipe's "
                         "folder)")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="your dataset factory's "
                                   "keyword arguments")
    path: str | None = Field(None, description="imagefolder: its root (with train/ and val/, "
                                               "or class folders and a val_fraction); shards: "
                                               "the folder written by hpctrain pack; tokens: "
                                               "the one written by hpctrain pack --tokens; "
                                               "modelnet: ModelNet's .off class folders or "
                                               "HDF5 files")
    num_classes: int | None = Field(None, ge=1, description="expected number of classes, "
                                    "checked against the data (None: take the data's)")
    val_fraction: float | None = Field(None, gt=0, lt=1, description="imagefolder without a "
                                       "val/ folder: the share of each class held out for "
                                       "validation (None: the data's own split)")
    collate: str | None = Field(None, description="your own collate function, making a batch "
                                "of a list of samples (padding, masks): package.module:fn or "
                                "path/to/file.py:fn; its batch reaches the task and the model "
                                "as it made it (data/batching.py)")
    val_batch_size: int | None = Field(None, ge=1, description="samples per device in an "
                                       "evaluation batch (None: twice train.batch_size)")
    bucketing: bool = Field(False, description="your own samples batched by length (their "
                            "inputs' first dimension), padded by your collate: less padding, "
                            "the order still shuffled each epoch (data/tokens/sequences.py)")
    num_workers: int | Auto = Field("auto", description="DataLoader worker processes per "
                                    "training process; auto: the process's share of the "
                                    "node's cores less one, 1 to 16; 0: load in the training "
                                    "process")
    prefetch_factor: int = Field(4, ge=1, description="batches each worker prepares ahead")
    persistent_workers: bool = Field(True, description="keep the workers between epochs "
                                     "(a new epoch's first batches without a restart)")
    worker_start: Literal["auto", "fork", "forkserver", "spawn"] = Field(
        "auto", description="how DataLoader workers start; auto: from a forkserver, a process "
        "without threads whose locks a worker could inherit held (data/worker_start.py), "
        "where the main module is hpctrain's and the data pickles, else fork")
    pin_memory: bool | Auto = Field("auto", description="page-locked batch memory, for "
                                    "copies to the GPU that overlap the step; auto: on a GPU")
    loader: Literal["auto", "buffers", "torch"] = Field(
        "auto", description="buffers: workers write each sample straight into batch buffers "
        "in shared memory, reused every step (data/batch_buffers.py); torch: torch's "
        "DataLoader; auto: buffers for packs and image folders decoded on the CPU and for "
        "the blocks of a token pack")

    _kind_of_user_data: str = PrivateAttr(kinds.OWN_DATA)  # set by Config, from the task
    _targets_of_user_data: str = PrivateAttr("classes")  # classes|labels|mask|values|any

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, value: str) -> str:
        if value in kinds.BUILTIN_DATASETS or user_code.is_code_reference(value):
            return value
        hint = difflib.get_close_matches(value, kinds.BUILTIN_DATASETS, n=1)
        raise ValueError(f"expected one of {', '.join(kinds.BUILTIN_DATASETS)}"
                         + (f" (did you mean {hint[0]!r}?)" if hint else "")
                         + ", or your own factory: package.module:make or path/to/file.py:make")

    @field_validator("collate")
    @classmethod
    def _collate_is_code(cls, value: str | None) -> str | None:
        if value is None or user_code.is_code_reference(value):
            return value
        raise ValueError("your collate function: package.module:fn or path/to/file.py:fn")

    @property
    def from_user_code(self) -> bool:
        return user_code.is_code_reference(self.dataset)

    @property
    def targets(self) -> str:
        """What your own samples' targets are: classes (an integer label), labels (a
        multi-hot vector), mask (a class per element), values (numbers: regression) or any
        (a LightningModule's steps take the batch as it is)."""
        return self._targets_of_user_data

    @property
    def kind(self) -> str:
        """What the samples are (data/kinds.py): the built-in dataset's kind, or your own
        data's (what the task learns from, images unless `task` says otherwise)."""
        if self.from_user_code:
            return self._kind_of_user_data
        return kinds.of_dataset(self.dataset).name

    @property
    def kind_spec(self) -> DataKind:
        return kinds.spec(self.kind)

    def factory_facts(self, seed: int) -> dict:
        """What your dataset factory may take by name: every kind's facts are offered (None
        where they are not this data's kind's), so a factory written for several kinds
        takes each."""
        return {"path": self.path, "image_size": self.images.image_size, "seed": seed,
                **{name: None for other in kinds.KINDS.values()
                   for name in other.own_facts(self)},
                **self.kind_spec.own_facts(self)}

    @model_validator(mode="after")
    def _needs_path(self):
        if self.dataset in kinds.NEEDS_PATH and not self.path:
            raise ValueError(f"dataset '{self.dataset}' needs data.path (for example "
                             "data.path=/scratch/imagenet)")
        for kind in kinds.KINDS.values():
            problem = kind.settings_problem(self)
            if problem:
                raise ValueError(problem)
        for name, value in (("collate", self.collate), ("bucketing", self.bucketing)):
            if value and not self.from_user_code:
                raise ValueError(f"data.{name} applies to your own dataset (data.dataset: "
                                 f"file.py:make); '{self.dataset}' is batched by hpctrain")
        if isinstance(self.num_workers, int) and self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0 or 'auto', got {self.num_workers}")
        return self


# the data section: the shared settings, then each kind's sections in the registry's order
DataConfig = create_model("DataConfig", __base__=_DataSettings, __module__=__name__,
                          **{name: (section, section()) for name, section in
                             kinds.sections().items()})
