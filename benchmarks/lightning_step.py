"""hpctrain's image step against PyTorch Lightning's Trainer, the loop its peers would pick.

Same model and initial weights, the same uint8 batches already in memory, batch, precision,
channels_last, compile, SGD + one-cycle schedule and label smoothing on every side; the
Lightning module logs loss and accuracy every step as its users do, since hpctrain counts
both on the device. A fourth side trains that same LightningModule on hpctrain's engine
(`task: lightning`: its training_step and self.log behind hpctrain's adapter), which is what
a Lightning user who switches gets. A hand-written PyTorch loop (engine_overhead.py's) is the
floor. The sides alternate round by round, forwards then backwards, so machine noise hits all
of them; each side is timed from the start of its training loop to the end (Lightning:
on_train_start to on_train_end), leaving out the once-per-run setup. Ratios are against
Lightning.

    python benchmarks/lightning_step.py                       # CPU: resnet_small, 32 px
    python benchmarks/lightning_step.py --model torchvision:resnet50 --image-size 224 \
        --batch-size 256 --precision bf16 --channels-last true --compile true   # on a GPU
"""

from __future__ import annotations

import argparse
import copy
import logging
import tempfile
import time
import warnings

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader

from engine_overhead import hand_written_loop
from harness import (alternate, hpctrain_parts, make_batches, median_ms, recipe_parts,
                     time_hpctrain, with_batches)

from hpctrain import user_code

LR = 0.2
LIGHTNING_PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}


class Classifier(L.LightningModule):
    """What a Lightning user writes for the default recipe's training."""

    def __init__(self, model: nn.Module, total_steps: int, channels_last: bool):
        super().__init__()
        self.model = model
        self.total_steps = total_steps
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255)
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255)

    def training_step(self, batch, batch_index):
        images, labels = batch
        images = images.permute(0, 3, 1, 2).float().sub_(self.mean).div_(self.std)
        logits = self.model(images.contiguous(memory_format=self.memory_format))
        loss = nn.functional.cross_entropy(logits, labels, label_smoothing=0.1)
        self.log("train_loss", loss)
        self.log("train_accuracy", (logits.argmax(1) == labels).float().mean())
        return loss

    def configure_optimizers(self):
        cuda = self.device.type == "cuda"
        optimizer = torch.optim.SGD(self.parameters(), lr=LR, momentum=0.9, nesterov=True,
                                    weight_decay=5e-4, foreach=not cuda, fused=cuda or None)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, LR,
                                                        total_steps=self.total_steps + 1)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class LoopClock(L.Callback):
    """Seconds from the start of the training loop to its end, the device drained."""

    def on_train_start(self, trainer, module):
        self._sync(module)
        self.start = time.perf_counter()

    def on_train_end(self, trainer, module):
        self._sync(module)
        self.seconds = time.perf_counter() - self.start

    @staticmethod
    def _sync(module):
        if module.device.type == "cuda":
            torch.cuda.synchronize()


def lightning_steps(module: Classifier, batches, steps: int, precision: str,
                    device: torch.device) -> float:
    """Seconds per step of one Trainer.fit over `steps` steps, set up for speed."""
    module.total_steps = steps
    clock = LoopClock()
    trainer = L.Trainer(accelerator="gpu" if device.type == "cuda" else "cpu", devices=1,
                        precision=LIGHTNING_PRECISION[precision], max_steps=steps,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0,
                        log_every_n_steps=20, benchmark=device.type == "cuda" or None,
                        callbacks=[clock])
    # batch_size=None hands the held batches through as they are (a bare list would be read as
    # one dataloader per batch)
    trainer.fit(module, train_dataloaders=DataLoader(batches, batch_size=None))
    return clock.seconds / steps


class HeldSamples(torch.utils.data.Dataset):
    """The held batches' samples, for the recipe's data.dataset (the loop then reads the
    batches themselves: harness.with_batches)."""

    def __init__(self, batches):
        self.images = torch.cat([images for images, _ in batches])
        self.labels = torch.cat([labels for _, labels in batches])

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index):
        return self.images[index], self.labels[index]


def module_on_hpctrain(module: Classifier, overrides: list[str], batches, output_dir: str):
    """hpctrain's parts for the LightningModule itself (task lightning), fed `batches`. Its
    schedule is built once for every round, so its one-cycle is made long enough for all;
    compile is the module's own (its model is compiled as on Lightning's side)."""
    module.total_steps = 10**6
    user_code.give("given:Classifier", lambda: module)
    user_code.give("given:HeldSamples", lambda: (HeldSamples(batches), HeldSamples(batches)))
    parts = recipe_parts("default", [*overrides, "model.name=given:Classifier",
                                     "data.dataset=given:HeldSamples", "task=lightning",
                                     "compile=false", "run_name=module-on-hpctrain"],
                        output_dir)
    return with_batches(parts, batches)


def quiet_lightning() -> None:
    """Lightning's start-up hints (no logger, few workers, TPU/GPU availability) off."""
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="hpctrain:resnet_small")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--precision", default="fp32", choices=sorted(LIGHTNING_PRECISION))
    parser.add_argument("--channels-last", default="false")
    parser.add_argument("--compile", default="false")
    parser.add_argument("--steps", type=int, default=20, help="steps per round")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    quiet_lightning()

    overrides = [f"model.name={args.model}", f"data.images.image_size={args.image_size}",
                 f"train.batch_size={args.batch_size}", f"precision={args.precision}",
                 f"channels_last={args.channels_last}", f"compile={args.compile}",
                 "data.synthetic.num_classes=10", "train.log_every=20"]
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        parts = hpctrain_parts(overrides, tmp)
        plan, device = parts.plan, parts.device
        batches = make_batches(8, args.batch_size, args.image_size, 10,
                               pin=device.type == "cuda")
        parts = with_batches(parts, batches)
        hand_model, lightning_model, engine_model = (copy.deepcopy(parts.model)
                                                     for _ in range(3))
        if plan.compile:
            hand_model, lightning_model, engine_model = (
                torch.compile(m) for m in (hand_model, lightning_model, engine_model))
        module = Classifier(lightning_model, args.steps, plan.channels_last)
        on_engine = module_on_hpctrain(Classifier(engine_model, args.steps, plan.channels_last),
                                       overrides, batches, tmp)

        def hand(steps: int) -> float:
            return hand_written_loop(hand_model, batches, steps, LR, plan.precision, device,
                                     plan.channels_last)

        for warm_up in (lambda: time_hpctrain(parts, 3), lambda: hand(3),
                        lambda: lightning_steps(module, batches, 3, plan.precision, device),
                        lambda: time_hpctrain(on_engine, 3)):
            warm_up()  # compilation and first-touch, every side
        lightning, ours, floor, theirs_on_ours = alternate(
            args.rounds,
            lambda: lightning_steps(module, batches, args.steps, plan.precision, device),
            lambda: time_hpctrain(parts, args.steps),
            lambda: hand(args.steps),
            lambda: time_hpctrain(on_engine, args.steps))
    print(f"lightning_step: {args.model}, {args.image_size} px, batch {args.batch_size}, "
          f"{plan.precision}, channels_last {plan.channels_last}, compile {plan.compile}, "
          f"device {plan.device_name}, Lightning {L.__version__}, "
          f"{args.rounds} rounds x {args.steps} steps")
    print(f"{'loop':<34}{'median ms/step':>16}{'img/s':>8}{'time ratio':>12}")
    for label, samples in (("Lightning Trainer", lightning),
                           ("hpctrain, the LightningModule", theirs_on_ours),
                           ("hpctrain", ours), ("hand-written PyTorch", floor)):
        med = median_ms(samples)
        print(f"{label:<34}{med:>16.1f}{args.batch_size / med * 1e3:>8.0f}"
              f"{med / median_ms(lightning):>12.3f}")


if __name__ == "__main__":
    main()
