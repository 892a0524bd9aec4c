"""hpctrain.fit against Hugging Face's Trainer on the same model, data and TrainingArguments.

A BERT classifier built from its config (no download), reviews tokenised by a WordPiece
tokenizer over the reviews' words, DataCollatorWithPadding, and one TrainingArguments given to
both: `Trainer(...).train()` and `hpctrain.fit(model, args=..., ...)`, each from the same initial
weights. The step time is the median of each logging interval's mean after the first
(warm-up): the Trainer's from a callback's clock at every step end, hpctrain's from
metrics.jsonl's seconds_per_step. The sides alternate round by round, forwards then
backwards. Ratios are against the Trainer; hpctrain runs as fit translates the arguments (its
own loader workers where the Trainer's default 0 is left).

    python benchmarks/hf_trainer_step.py                              # CPU
    python benchmarks/hf_trainer_step.py --hidden 768 --layers 12 --batch-size 32 \
        --texts 20000 --steps 200 --bf16                              # on a GPU
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))  # hf_text: the tests' texts

from harness import alternate, print_ratios  # noqa: E402
from hf_text import Encoded, reviews, tokenizer  # noqa: E402

import hpctrain  # noqa: E402


def classifier(vocab_size: int, hidden: int, layers: int):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(
        vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64), intermediate_size=4 * hidden,
        max_position_embeddings=128, num_labels=2))


def interval_means(ends: list[float], every: int) -> list[float]:
    """Seconds per step of each interval of `every` steps, from the step ends' clock."""
    return [(ends[i + every] - ends[i]) / every for i in range(0, len(ends) - every, every)]


def trainer_seconds(model, args, data) -> float:
    from transformers import Trainer, TrainerCallback

    ends: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *_, **__):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            ends.append(time.perf_counter())

    Trainer(model=model, args=args, train_dataset=data[0], data_collator=data[1],
            callbacks=[Clock()]).train()
    return statistics.median(interval_means(ends, args.logging_steps)[1:])


def fit_seconds(model, args, data, extra: dict) -> float:
    summary = hpctrain.fit(model, args=args, train_dataset=data[0], data_collator=data[1],
                           report=False, **{"checkpoint.every_steps": None,
                                            "checkpoint.every_epochs": 1e6, **extra})
    lines = (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line) for line in lines if '"kind": "train"' in line]
    return statistics.median(r["seconds_per_step"] for r in steps[1:])


def quiet() -> None:
    logging.getLogger("transformers").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=60, help="steps per run")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of fit's besides the translation (data.num_workers=0)")
    args = parser.parse_args()
    quiet()
    from transformers import DataCollatorWithPadding, TrainingArguments, __version__

    pairs = reviews(args.texts, 0)
    encode = tokenizer([text for text, _ in pairs])
    data = (Encoded(pairs, encode), DataCollatorWithPadding(encode))
    first = classifier(encode.vocab_size, args.hidden, args.layers)
    extra = dict(setting.split("=", 1) for setting in args.set)
    gpu = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as tmp:
        settings = dict(per_device_train_batch_size=args.batch_size, max_steps=args.steps,
                        learning_rate=1e-4, warmup_steps=0.1, logging_steps=args.log_every,
                        save_strategy="no", report_to="none", bf16=args.bf16,
                        use_cpu=not gpu, disable_tqdm=True)
        trainer_args = TrainingArguments(str(Path(tmp) / "trainer"), **settings)
        fit_args = TrainingArguments(str(Path(tmp) / "fit"), **settings)
        theirs, ours = alternate(
            args.rounds,
            lambda: trainer_seconds(copy.deepcopy(first), trainer_args, data),
            lambda: fit_seconds(copy.deepcopy(first), fit_args, data, extra))
    device = torch.cuda.get_device_name() if gpu else "cpu"
    print(f"hf_trainer_step: BERT {args.layers} layers x {args.hidden}, "
          f"{sum(p.numel() for p in first.parameters()) / 1e6:.1f} M parameters, batch "
          f"{args.batch_size}, {'bf16' if args.bf16 else 'fp32'}, device {device}, "
          f"transformers {__version__}, {args.rounds} rounds x {args.steps} steps"
          + "".join(f", {setting}" for setting in args.set))
    print_ratios([("Hugging Face Trainer", theirs), ("hpctrain.fit", ours)], "samples",
                 args.batch_size)


if __name__ == "__main__":
    main()
