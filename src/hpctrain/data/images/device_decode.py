"""`data.images.decode: gpu`: JPEGs decoded on the GPU (nvJPEG), a batch at a time.

Workers then only read bytes and draw each sample's view (crop box and flip, the same draw as on
the CPU path), so a node with few cores per GPU stops being the limit: batched nvJPEG on one
A100 decodes about 7,800 img/s, 10-25 CPU cores' worth (anchors.md). The training process
decodes the batch with one batched call, TorchCodec's `decode_jpeg` where it is installed
(`pip install 'hpctrain[gpu-decode]'`; torchvision 0.29 deprecated its own image decoding in
TorchCodec's favour) and else torchvision.io's, the same nvJPEG underneath; then it crops,
resizes (antialiased bilinear, as on the CPU) and flips each image on the device; raw samples
are only copied there. The result is the NHWC uint8 batch the CPU path would deliver, so
`DeviceBatcher` and everything after it are unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from hpctrain.data.images.image_folders import crop_rows_columns
from hpctrain.data.images.image_pack import KIND_RAW


class EncodedBatch(NamedTuple):
    """What workers deliver under data.images.decode=gpu: stored bytes plus each sample's view."""

    payloads: list[torch.Tensor]  # uint8 1-D: JPEG bytes, or raw RGB pixels (header removed)
    kinds: torch.Tensor  # KIND_JPEG / KIND_RAW per sample
    shapes: torch.Tensor  # (width, height) per sample, stored size
    boxes: torch.Tensor  # (left, top, right, bottom) per sample, in stored pixels
    flips: torch.Tensor  # bool per sample
    size: int  # output side


def collate_encoded(samples: list[tuple[tuple, int]]) -> tuple[EncodedBatch, torch.Tensor]:
    """DataLoader collate for (encoded sample, label) pairs: bytes stay a list (they differ in
    length); the small per-sample fields become tensors."""
    encoded = [sample for sample, _ in samples]
    return EncodedBatch(
        payloads=[e[0] for e in encoded],
        kinds=torch.tensor([e[1] for e in encoded], dtype=torch.uint8),
        shapes=torch.tensor([e[2] for e in encoded], dtype=torch.int32),
        boxes=torch.tensor([e[3] for e in encoded], dtype=torch.float32),
        flips=torch.tensor([e[4] for e in encoded], dtype=torch.bool),
        size=encoded[0][5]), torch.tensor([label for _, label in samples])


@functools.cache
def jpeg_batch_decoder() -> tuple[str, Callable]:
    """(name, decode(list of byte tensors, device) -> list of CHW uint8 RGB): TorchCodec's
    where installed, else torchvision.io's."""
    try:
        from torchcodec.decoders import decode_jpeg as torchcodec_decode
    except ImportError:
        from torchvision.io import ImageReadMode, decode_jpeg

        return "torchvision", lambda payloads, device: decode_jpeg(
            payloads, mode=ImageReadMode.RGB, device=device)
    return "torchcodec", lambda payloads, device: torchcodec_decode(
        payloads, mode="RGB", device=device)


def decode_batch(batch: EncodedBatch, device: torch.device) -> torch.Tensor:
    """EncodedBatch -> NHWC uint8 on `device`: nvJPEG for the JPEGs in one batched call."""
    jpegs = [i for i, kind in enumerate(batch.kinds.tolist()) if kind != KIND_RAW]
    images: list[torch.Tensor | None] = [None] * len(batch.payloads)
    if jpegs:
        decoded = jpeg_batch_decoder()[1]([batch.payloads[i] for i in jpegs], device)
        for i, image in zip(jpegs, decoded):
            images[i] = image
    for i, image in enumerate(images):
        if image is None:
            width, height = batch.shapes[i].tolist()
            images[i] = batch.payloads[i].to(device, non_blocking=True).view(
                height, width, 3).permute(2, 0, 1)
    return torch.stack([_render(image, box, batch.size, flip) for image, box, flip in
                        zip(images, batch.boxes.tolist(), batch.flips.tolist())])


def _render(image: torch.Tensor, box: list[float], size: int, flip: bool) -> torch.Tensor:
    """One CHW uint8 image -> its box resized to size x size (and flipped), HWC uint8."""
    rows, columns = crop_rows_columns(box)
    crop = image[:, rows, columns][None].float()
    if crop.shape[-2:] != (size, size):
        crop = F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True,
                             align_corners=False)
    out = crop[0].round_().clamp_(0, 255).to(torch.uint8).permute(1, 2, 0)
    return out.flip(1) if flip else out
