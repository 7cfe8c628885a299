"""Hugging Face Trainer on a tiny BERT built from a config (random weights, nothing downloaded),
sequence classification on synthetic token ids, evaluation every epoch. ``hf_trainer.py ACCUM``:
gradient accumulation over ACCUM micro-batches."""

from __future__ import annotations

import sys
import time
from typing import Any

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from truth import Truth

TRUTH = Truth()


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, 100, (n, 16), generator=g)
        self.labels = (self.ids[:, 0] > 50).long()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.ids[i],
            "attention_mask": torch.ones(16, dtype=torch.long),
            "labels": self.labels[i],
        }


class TimedTrainer(Trainer):
    def compute_loss(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        # the model's call with the labels: its forward computes the loss
        t0 = time.perf_counter()
        try:
            return super().compute_loss(model, *args, **kwargs)
        finally:
            if model.training:
                TRUTH.add("forward", time.perf_counter() - t0)

    def get_batch_samples(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return super().get_batch_samples(*args, **kwargs)
        finally:
            TRUTH.add("data_wait", time.perf_counter() - t0)


class OptimizerTimer(TrainerCallback):
    """Times the torch optimizer's step, which Accelerate's optimizer wrapper calls (the wrapper's own
    bookkeeping, such as its package lookups, is not the optimizer's work)."""

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        inner = getattr(kwargs["optimizer"], "optimizer", kwargs["optimizer"])
        inner.step = TRUTH.timed("optimizer", inner.step)


def main() -> None:
    accum = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=2,
    )
    model = BertForSequenceClassification(config)
    model.zero_grad = TRUTH.timed("optimizer", model.zero_grad)  # type: ignore[method-assign]
    args = TrainingArguments(
        output_dir="out",
        num_train_epochs=2,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=16,
        gradient_accumulation_steps=accum,
        learning_rate=1e-3,
        eval_strategy="epoch",
        save_strategy="no",
        logging_strategy="steps",
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = TimedTrainer(
        model=model,
        args=args,
        train_dataset=Tokens(128, 1),
        eval_dataset=Tokens(32, 2),
        callbacks=[OptimizerTimer()],
    )
    trainer.accelerator.backward = TRUTH.timed("backward", trainer.accelerator.backward)  # type: ignore[method-assign]
    trainer.train()
    TRUTH.steps = trainer.state.global_step
    TRUTH.epochs = round(trainer.state.epoch or 0)
    TRUTH.losses = [repr(e["loss"]) for e in trainer.state.log_history if "loss" in e]
    TRUTH.write(accumulation=accum)


if __name__ == "__main__":
    main()
