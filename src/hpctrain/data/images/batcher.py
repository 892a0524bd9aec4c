"""Image batches onto the device: uint8 NHWC from the loader to normalised NCHW there."""

from __future__ import annotations

import torch

from hpctrain.data.images.device_decode import EncodedBatch, decode_batch


class DeviceBatcher:
    """Move a uint8 batch to the device (non-blocking from pinned memory), then convert,
    normalise and lay it out (channels_last) there, as batched tensor operations."""

    def __init__(self, device: torch.device, mean, std, channels_last: bool):
        self.device = device
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.scale = (1.0 / (255.0 * torch.tensor(std))).view(1, 3, 1, 1).to(device)
        self.shift = (torch.tensor(mean) / torch.tensor(std)).view(1, 3, 1, 1).to(device)

    def __call__(self, images: torch.Tensor | EncodedBatch, labels: torch.Tensor):
        """NHWC uint8 (or an EncodedBatch, decoded here) in; NCHW float out (NHWC in memory,
        which is channels_last). Float NCHW images (your own dataset's, already normalised)
        are only moved and laid out."""
        if isinstance(images, EncodedBatch):
            images = decode_batch(images, self.device)
        images = images.to(self.device, non_blocking=True)
        labels = labels.to(self.device, non_blocking=True)
        if images.dtype == torch.uint8:
            images = images.permute(0, 3, 1, 2).float().mul_(self.scale).sub_(self.shift)
        return images.contiguous(memory_format=self.memory_format), labels
