"""Checkpoints as the frameworks write them; prints what it wrote as JSON (the truth to check against).

python frameworks_ckpt.py DIR torch|safetensors|hf|lightning
"""

import json
import os
import sys
import time

import torch

out, which = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
truth: dict = {"saves": [], "loads": []}


def sizes(d: str) -> dict[str, int]:
    return {os.path.join(r, f): os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs}


if which == "torch":
    # the job's own durable save: torch.save to a temporary name, fsync, rename into place
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        model(torch.randn(8, 256)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if step % 2 == 1:
            final = os.path.join(out, f"step-{step}.pt")
            tmp = final + ".tmp"
            t0 = time.perf_counter()
            torch.save(model.state_dict(), tmp)
            fd = os.open(tmp, os.O_RDONLY)
            t1 = time.perf_counter()
            os.fsync(fd)
            os.close(fd)
            os.replace(tmp, final)
            truth["saves"].append(
                {
                    "path": final,
                    "bytes": os.path.getsize(final),
                    "fsync_s": time.perf_counter() - t1,
                    "total_s": time.perf_counter() - t0,
                }
            )
elif which == "safetensors":
    from safetensors.torch import load_file, load_model, save_file, save_model

    model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.Linear(128, 4))
    a = os.path.join(out, "tensors.safetensors")
    save_file({"w": torch.randn(300, 300)}, a)
    m = os.path.join(out, "model.safetensors")
    save_model(model, m)
    load_file(a)
    load_model(model, m)
    truth["saves"] = [{"path": p, "bytes": os.path.getsize(p)} for p in (a, m)]
    truth["loads"] = [{"path": p, "bytes": os.path.getsize(p)} for p in (a, m)]
elif which == "hf":
    from torch.utils.data import Dataset
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    cfg = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=256, n_positions=32)
    model = GPT2LMHeadModel(cfg)
    pre = os.path.join(out, "pretrained")
    model.save_pretrained(pre)
    truth["saves"].append({"path": pre, "bytes": sum(sizes(pre).values()), "files": len(sizes(pre))})

    class Tokens(Dataset):
        def __len__(self) -> int:
            return 32

        def __getitem__(self, i: int) -> dict:
            g = torch.Generator().manual_seed(i)
            ids = torch.randint(0, 256, (16,), generator=g)
            return {"input_ids": ids, "labels": ids}

    args = TrainingArguments(
        output_dir=os.path.join(out, "trainer"),
        per_device_train_batch_size=8,
        max_steps=4,
        save_steps=2,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
        logging_strategy="no",
    )
    Trainer(model=model, args=args, train_dataset=Tokens()).train()
    for step in (2, 4):
        d = os.path.join(out, "trainer", f"checkpoint-{step}")
        truth["saves"].append({"path": d, "bytes": sum(sizes(d).values()), "files": len(sizes(d))})
elif which == "lightning":
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(64, 64)

        def training_step(self, batch, i):  # type: ignore[no-untyped-def]
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = DataLoader(TensorDataset(torch.randn(64, 64)), batch_size=8)
    ck = ModelCheckpoint(dirpath=os.path.join(out, "ckpt"), every_n_train_steps=4, save_top_k=-1)
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        callbacks=[ck],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Tiny(), data)
    final = os.path.join(out, "final.ckpt")
    trainer.save_checkpoint(final)
    for p, b in sorted(sizes(os.path.join(out, "ckpt")).items()):
        truth["saves"].append({"path": p, "bytes": b})
    truth["saves"].append({"path": final, "bytes": os.path.getsize(final)})
print(json.dumps(truth))
