"""data.images.decode=gpu: the tests that need no training run, no process and no server (the others
are tests/runs/test_device_decode.py)."""

import pytest
import torch

from hpctrain.data.images.image_packing import PackOptions, pack
from hpctrain.data.images.image_pack import Pack

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding:DeprecationWarning")


def test_torchcodec_decodes_the_batches_where_installed_and_torchvision_agrees(image_folder,
                                                                              tmp_path):
    """TorchCodec is preferred (torchvision 0.29 deprecates its image decoding); the old path
    stays for installations without it, and both give the same pixels."""
    from torchvision.io import ImageReadMode, decode_jpeg

    from hpctrain.data.images.device_decode import jpeg_batch_decoder
    from hpctrain.data.images.image_pack import ShardReader

    pack(image_folder, tmp_path / "p", PackOptions(), workers=1, log=lambda *_: None)
    split = Pack(tmp_path / "p").split("train")
    reader = ShardReader(split.shards)
    payloads = [torch.frombuffer(bytearray(reader.read(r)), dtype=torch.uint8)
                for r in split.index[:6]]
    name, decode = jpeg_batch_decoder()
    assert name == "torchcodec"  # a test extra
    ours = decode(payloads, torch.device("cpu"))
    theirs = decode_jpeg(payloads, mode=ImageReadMode.RGB, device="cpu")
    assert len(ours) == 6 and all(a.equal(b) for a, b in zip(ours, theirs))
