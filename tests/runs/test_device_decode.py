"""data.images.decode=gpu: the batched device decoding path, run here on the CPU (TorchCodec's and
torchvision's decode_jpeg take a list on any device), and its refusal without a GPU.

Here the tests that train, in this process or in an `hpctrain` process of their own; the
others are tests/unit/test_device_decode.py."""

import pytest
import torch
from torch.utils.data import DataLoader

from hpctrain.config import AugmentConfig
from hpctrain.data.images.device_decode import EncodedBatch, collate_encoded
from hpctrain.data.images.batcher import DeviceBatcher
from hpctrain.data.images.image_packing import PackOptions, pack
from hpctrain.data.sampling import EpochSampler
from hpctrain.data.images.image_pack_dataset import ShardDataset
from hpctrain.data.images.image_pack import KIND_RAW, Pack

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding:DeprecationWarning")


def test_device_decoding_delivers_what_the_cpu_path_delivers(image_folder, tmp_path):
    pack(image_folder, tmp_path / "p", PackOptions(store="auto", raw_max_side=0,
                                                   raw_fraction=0.5),
         workers=1, log=lambda *_: None)
    split = Pack(tmp_path / "p").split("train")
    assert 0 < int((split.index["kind"] == KIND_RAW).sum()) < len(split.index)
    augment = AugmentConfig(crop_scale=(0.3, 1.0))
    on_cpu = ShardDataset(split, None, True, augment, 0)
    encoded = ShardDataset(split, None, True, augment, 0, encoded=True)
    sampler = EpochSampler(len(on_cpu), 12, shuffle=True)
    batcher = DeviceBatcher(torch.device("cpu"), (0.5,) * 3, (0.25,) * 3, True)
    cpu_batch = next(iter(DataLoader(on_cpu, batch_size=24, sampler=sampler)))
    device_batch = next(iter(DataLoader(encoded, batch_size=24, sampler=sampler,
                                        collate_fn=collate_encoded, num_workers=1)))
    assert isinstance(device_batch[0], EncodedBatch)
    assert device_batch[1].equal(cpu_batch[1])
    ours, _ = batcher(*device_batch)
    theirs, _ = batcher(*cpu_batch)
    difference = (ours - theirs).abs() * 0.25 * 255  # back to pixel levels
    assert difference.max() <= 2 and difference.mean() < 0.3  # rounding of two resize kernels
    assert ours.shape == theirs.shape == (24, 3, 12, 12)


def test_gpu_decoding_needs_shards_and_a_gpu(run_cli, tiny, image_folder, tmp_path):
    code, _, err = run_cli("run", "default", *tiny("data.images.decode=gpu"))
    assert code == 2 and "data.images.decode=gpu applies to dataset 'shards' only" in err
    pack(image_folder, tmp_path / "p", PackOptions(), workers=1, log=lambda *_: None)
    code, _, err = run_cli("run", "default", *tiny("data.dataset=shards",
                                                   f"data.path={tmp_path / 'p'}",
                                                   "data.images.decode=gpu", "device=cpu"))
    assert code == 2 and "data.images.decode=gpu decodes with nvJPEG on a CUDA device, but this " \
        "run is on cpu: set data.images.decode=cpu" in err
