"""Mixup and CutMix, on the device, on whole batches (timm's `Mixup`).

They run after `DeviceBatcher`, on the normalised float batch: blending a batch with its own
reverse is one fused operation there, where on the CPU it would cost every worker a float copy
of every image. Label smoothing moves into the soft targets, and the loss becomes soft-target
cross-entropy. timm draws the mixing weights from NumPy's global generator, which checkpoints
save and restore, so a resumed run mixes as the uninterrupted one would.
"""

from __future__ import annotations

from hpctrain.errors import ConfigError


def build_mixing(augment, num_classes: int, label_smoothing: float,
                 batch_size: int):
    """timm's Mixup for these settings (`augment`: the recipe's data.augment), or None when
    both alphas are 0."""
    if augment.mixup_alpha == 0 and augment.cutmix_alpha == 0:
        return None
    if batch_size % 2:
        raise ConfigError(f"mixup/CutMix pair each image with another of its batch, so the "
                          f"per-device batch must be even (it is {batch_size}); change "
                          "train.batch_size or train.global_batch_size")
    from timm.data import Mixup

    return Mixup(mixup_alpha=augment.mixup_alpha, cutmix_alpha=augment.cutmix_alpha,
                 prob=augment.mix_prob, switch_prob=augment.mix_switch_prob, mode="batch",
                 label_smoothing=label_smoothing, num_classes=num_classes)
