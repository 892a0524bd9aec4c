"""What a data kind is, as hpctrain's other rooms ask it: a `DataKind`.

A kind is what the samples are (images, tokens, points, your own tensors). Its spec is read
when a recipe is (the recipe's data section is made of its kinds' sections, and a dataset's
name says its kind), so it holds plain values and functions and imports no torch: what
needs torch (its datasets, its device batcher) is imported by those functions when called.

The contract a kind's built-in datasets honour (`datasets_of` makes them; the loader,
data/loader.py, reads them):
- `len(dataset)`: its samples;
- `dataset[key]` with a `SampleKey` (index, epoch, size), not an int: the sample `index`,
  drawn for `epoch` (an augmentation seeded by it) at `size` (the kind's `key_size` for that
  epoch; 0 where samples have one size), as (inputs, target) that the kind's `collate`
  (None: stacking) makes a batch of; the validation set alike, at epoch 0 and validation's
  size (`sample_key`); datasets of your own (data.dataset=file.py:make) are indexed by int;
- optionally `row_layout(size)` and `render_rows(keys, rows)` (data/batch_buffers.py): the
  samples written straight into shared batch buffers;
- it pickles (loader workers may start from a forkserver: data/worker_start.py) and reads
  its files in the workers, not when made, where they are large.
`tests/unit/test_data_kinds.py` holds every registered kind's datasets to it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

# samples a built-in dataset may make (ImageNet has 1.3 M): more is refused before any work,
# where 10^12 was a MemoryError after a temporary folder was left in the cache
MOST_SAMPLES = 10_000_000


class SampleKey(NamedTuple):
    """What a kind's datasets are indexed by (data/sampling.py's sampler yields them)."""

    index: int
    epoch: int
    size: int


SHAPES = ("fixed", "few", "varied", "unknown")  # a kind's training batches' shapes (shapes())
BOUNDED_SHAPES = SHAPES[:2]  # a graph per shape is a bounded few graphs


def _shapes(data) -> str:
    """hpctrain's own datasets of a kind: one shape; your own: yours to say."""
    return "unknown" if data.from_user_code else "fixed"


def _sample_key(data, index: int):
    """A validation sample's key: the sampler's at epoch 0 and validation's size; your own
    datasets' an int."""
    if data.from_user_code:
        return index
    return SampleKey(index, 0, data.kind_spec.key_size(data, None))


def _no_sizes(data) -> tuple[int, ...]:
    return ()


def _nothing(*args):
    return None


@dataclass(frozen=True)
class DataKind:
    """One data kind.

    - `name`: the kind (a task's `data_kind`, summary and banner words);
    - `datasets`: its built-in datasets (`data.dataset`), and `needs_path` those of them
      read from `data.path`;
    - `settings`: the recipe's data sections it owns, field name -> its Section class
      (`data.tokens`, `data.points`, ...), in the order the data section lists them;
    - `samples_word`: its samples in messages ("point clouds"); `model_hint`: the models
      that take them, said when the model named does not;
    - `models`: hpctrain's models made for this kind only, `hpctrain:NAME` -> where its
      factory is, "package.module:function" (imported when the model is made: it needs
      torch), which the model factory refuses on other data; `model_word` what they are in
      messages ("a point-cloud model");
      `only_its_models`: no other model takes it;
    - `vocabulary`: its samples are token ids, the model's output is a vocabulary (a
      language model), and the model is checked against that vocabulary when built;
    - `any_shape`: samples of any shape, read from the first one (your own tensors);
    - `channels_first`: batches are (N, C, H, W), which channels_last can lay out;
    - `unit(data)`: what `bench data` counts ("image", "block", "cloud");
    - `datasets_of(data, seed, rank, scratch) -> (train, val, classes or vocabulary)`: its
      built-in datasets (`scratch`: the node-local folder for data.images.cache=auto);
    - `loaders(data, batch_size, seed, rank, world_size, common) -> DataBundle | None`: its
      own loaders where the sampled datasets' are not what it needs;
    - `collate(data)`: the batch collation its datasets need (None: stacking);
    - `batcher(device, data, channels_last) -> fn(inputs, targets) -> (inputs, targets)`:
      a host batch onto the device, ready for the model;
    - `sample_key(data, index)`: a validation sample's key (the contract above);
    - `key_size(data, epoch)`: the size the sampler's keys carry in `epoch` (None:
      validation), `SampleKey.size`: the image side for images, which grows under
      progressive resizing; 0 for kinds whose samples have one size;
    - `image_sizes(data)`: every image size a run feeds the model (none but for images);
    - `task_facts`: what the kind tells its tasks, by name -> fn(data), asked when a task is
      built (`TaskSetup.fact`: the axis point clouds turn about, which may read files);
    - `sample_shape(data)`: one sample's shape, for `memory` (None: `any_shape`);
    - `width(data) -> (width, note) | None`: the model's output width (classes or
      vocabulary) from the recipe or the data's index alone, with a note where assumed;
    - `smaller_sample(data, shape) -> (setting, value, words) | None`: the setting that
      shrinks a sample, which out-of-memory advice tries;
    - `stand_in(data, batch, batches, num_classes)`: data of the same shape that costs nothing to
      read, for `bench data`'s model rate (None: its own data is cheap enough);
    - `settings_problem(data)`: what is wrong with its sections for the data the recipe
      reads (asked of every kind, whichever the data's is: None for nothing);
    - `own_data_problem(data)`: why your own data of this kind cannot take these settings;
    - `own_facts(data)`: what your dataset factory may take by name (`num_points`);
    - `own_sample_problem(sample, num_classes, data)`: what is wrong with one of your own
      samples (None: nothing), `own_expected(data)` what one should be, and
      `own_hint(sample)` a task it looks made for instead;
    - `classes_needed`: your own data of this kind must say its classes (its models are
      sized by them; others' output width can say it);
    - `shapes(data)`: the shapes its training batches come in, one of SHAPES: `fixed`;
      `few`, known to be few (a token pack's documents padded to width buckets, images
      resized per epoch), which torch.compile then compiles statically, one graph each, rather
      than one graph of symbolic sizes; `varied` (documents padded each to its batch's
      longest); `unknown` (your own tensors: your collate may pad them). CUDA graphs record
      one graph per shape: `compile_mode=auto` uses them only on fixed or few shapes;
      `fewer_shapes` says how varied batches come in a few.
    """

    name: str
    samples_word: str
    model_hint: str
    unit: Callable[[object], str]
    batcher: Callable
    datasets: tuple[str, ...] = ()
    needs_path: tuple[str, ...] = ()
    settings: dict[str, type] = field(default_factory=dict)
    models: dict[str, str] = field(default_factory=dict)
    model_word: str = ""
    only_its_models: bool = False
    vocabulary: bool = False
    any_shape: bool = False
    channels_first: bool = False
    datasets_of: Callable | None = None
    loaders: Callable = _nothing
    collate: Callable = _nothing
    sample_key: Callable = _sample_key
    key_size: Callable[[object, int | None], int] = lambda data, epoch: 0
    task_facts: dict[str, Callable] = field(default_factory=dict)
    image_sizes: Callable[[object], tuple[int, ...]] = _no_sizes
    sample_shape: Callable[[object], tuple[int, ...] | None] = _nothing
    width: Callable = _nothing
    smaller_sample: Callable = _nothing
    stand_in: Callable = _nothing
    settings_problem: Callable[[object], str | None] = _nothing
    own_data_problem: Callable[[object], str | None] = _nothing
    own_facts: Callable[[object], dict] = lambda data: {}
    own_sample_problem: Callable = _nothing
    own_expected: Callable[[object], str] = lambda data: ""
    own_hint: Callable[[object], str] = lambda sample: ""
    classes_needed: bool = False
    shapes: Callable[[object], str] = _shapes
    fewer_shapes: str = "a collate that pads to a few fixed lengths"


def three_quarters(size: int) -> int:
    """A smaller sample side for out-of-memory advice: three quarters of `size`, rounded down
    to a multiple of 32 (at least 32)."""
    return max(32, size * 3 // 4 // 32 * 32)


def own_check(name: str):
    """The user_datasets.py check `name`, imported when a sample is checked (it needs
    torch)."""
    def check(*args):
        from hpctrain.data import user_datasets

        return getattr(user_datasets, name)(*args)
    return check


def moving_batcher(device, data, channels_last: bool):
    """The batcher of kinds whose batches reach the model as they are: moved to the device
    (floating tensors in the default dtype)."""
    from hpctrain.tasks.tensors import moved

    return lambda inputs, targets: (moved(inputs, device), moved(targets, device))
