"""Your own loss and metric (examples/csv_images/README.md).

    hpctrain run examples/csv_images/recipe.yaml data.path=DATA \
        task.loss=examples/csv_images/focal.py:focal_loss \
        task.metrics.top2=examples/csv_images/focal.py:top2_correct
"""

import torch
import torch.nn.functional as F


def focal_loss(logits: torch.Tensor, targets: torch.Tensor, gamma: float = 2.0) -> torch.Tensor:
    """Focal loss (Lin et al. 2017): cross-entropy scaled down where the model is already sure,
    so training dwells on the hard samples. One number: the batch mean."""
    log_p = F.log_softmax(logits.float(), dim=1).gather(1, targets[:, None]).squeeze(1)
    return (-(1 - log_p.exp()) ** gamma * log_p).mean()


def top2_correct(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """How many samples have their label among the two highest scores: a sum, which hpctrain
    adds over steps and processes and divides by the samples (no read-back per step)."""
    return (logits.topk(2, dim=1).indices == labels[:, None]).any(dim=1).sum()
