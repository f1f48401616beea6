"""Training: ``attnmt train CONFIG [--run DIR] [--set section.key=value ...]``.

Training on an existing run directory resumes it exactly: the same batches, the
same dropout masks, the same losses as a run that was never interrupted.
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from attnmt.checkpoint import (average_into, load_state, load_weights, save_state,
                               save_weights)
from attnmt.config import Config, TrainConfig, load_config, save_config
from attnmt.data import PAD_ID
from attnmt.data.batching import source_batches, source_tensor, token_batches
from attnmt.data.datasets import TokenizedSplit
from attnmt.distributed import (all_reduce_sum, barrier, broadcast_object, gather_objects,
                                init_cluster, resolve_device, resolve_precision, shard_batches,
                                shutdown)
from attnmt.errors import UserError
from attnmt.evaluate import corpus_bleu
from attnmt.loss import projected_cross_entropy
from attnmt.model import Seq2Seq, build_model
from attnmt.run import RunDirectory, open_run, prepare_data, say
from attnmt.search import greedy_search

LOG_COLUMNS = ["step", "epoch", "loss", "lr", "tokens_per_s", "valid_loss", "valid_ppl",
               "valid_bleu", "elapsed_s"]


def learning_rate(step: int, config: TrainConfig, plateau_scale: float = 1.0) -> float:
    """Learning rate at update ``step`` (1-based).

    ``noam``: linear warmup to ``lr`` at ``warmup`` steps, then ``lr * sqrt(warmup / step)``
    (Vaswani et al. 2017, with the peak given directly). ``constant`` and ``plateau``:
    linear warmup, then ``lr`` (times the plateau reductions so far).
    """
    warmup_factor = min(1.0, step / config.warmup) if config.warmup else 1.0
    if config.schedule == "noam" and config.warmup and step > config.warmup:
        return config.lr * math.sqrt(config.warmup / step)
    return config.lr * warmup_factor * plateau_scale


@dataclass
class Progress:
    """Where training stands; saved with every checkpoint for exact resume."""
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0              # index of the next batch of this epoch
    elapsed: float = 0.0                 # seconds of training and validation, over all sessions
    best: float | None = None            # best validation metric
    bad_validations: int = 0
    plateau_scale: float = 1.0
    checkpoints: list[str] = field(default_factory=list)
    finished: bool = False               # stopped early: no improvement for `patience` validations
    world: int = 1                       # processes that trained the run (resume needs as many)


class TrainingLoss(nn.Module):
    """The summed training loss of a batch as a module, so DistributedDataParallel can wrap it."""

    def __init__(self, model: Seq2Seq):
        super().__init__()
        self.model = model

    def forward(self, src, src_mask, tgt_in, tgt_mask, tgt_out, label_smoothing: float):
        hidden = self.model.features(src, src_mask, tgt_in, tgt_mask)
        return projected_cross_entropy(hidden.flatten(0, 1), self.model.generator, tgt_out.flatten(),
                                       label_smoothing, PAD_ID)


class Trainer:
    def __init__(self, config: Config, run: RunDirectory):
        self.config, self.train_config, self.run = config, config.train, run
        # oneDNN caches a bf16 matmul primitive (with its buffers) per input shape, up to
        # 1024 of them; token batches come in hundreds of shapes, so resident memory grew
        # past 5 GiB in 250 steps. 16 entries keep it near 2 GiB at the same speed. Read
        # when oneDNN creates its first primitive, so it must be set before that.
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")
        torch.set_num_threads(self.train_config.threads or os.cpu_count() or 1)
        device = resolve_device(self.train_config.device)
        self.cluster = init_cluster(device.type)
        self.device = torch.device("cuda", self.cluster.local_rank) if device.type == "cuda" else device
        self.autocast_dtype = resolve_precision(self.train_config.precision, self.device)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.autocast_dtype == torch.float16)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        torch.manual_seed(self.train_config.seed)          # the same initial weights everywhere
        self.tokenizers, self.train_split, self.valid_split = prepare_data(config, run, self.cluster)
        self.model = build_model(config.model, self.tokenizers[0].vocab_size,
                                 self.tokenizers[1].vocab_size).to(self.device)
        if self.cluster.rank:                             # different dropout on every rank
            torch.manual_seed(self.train_config.seed + 7919 * self.cluster.rank)
        self.loss_module = TrainingLoss(self.model)
        if self.cluster.active:
            self.loss_module = DistributedDataParallel(self.loss_module)
        if self.train_config.compile:
            self.loss_module = torch.compile(self.loss_module, dynamic=True)
        optimizer_class = torch.optim.AdamW if self.train_config.optimizer == "adamw" else torch.optim.Adam
        self.optimizer = optimizer_class(self.model.parameters(), lr=self.train_config.lr,
                                         betas=self.train_config.betas, eps=1e-9,
                                         weight_decay=self.train_config.weight_decay)
        self.progress = Progress(world=self.cluster.world)
        self.tensorboard = _tensorboard_writer(run.path / "tensorboard") if self.cluster.is_main else None

    # --- checkpoints -----------------------------------------------------------------------

    def save_checkpoint(self, improved: bool) -> None:
        """Called on every rank (the RNG states are gathered); rank 0 writes."""
        rng_states = gather_objects(torch.get_rng_state(), self.cluster)
        if not self.cluster.is_main:
            return
        self.run.checkpoints.mkdir(exist_ok=True)
        name = f"step_{self.progress.step}.safetensors"
        metadata = {"step": str(self.progress.step), "format": "attnmt"}
        save_weights(self.model, self.run.checkpoints / name, metadata)
        if improved:
            save_weights(self.model, self.run.best, metadata)
        if name not in self.progress.checkpoints:
            self.progress.checkpoints.append(name)
        removed = self.progress.checkpoints[:-self.train_config.keep_checkpoints]
        self.progress.checkpoints = self.progress.checkpoints[-self.train_config.keep_checkpoints:]
        save_state({"progress": asdict(self.progress), "optimizer": self.optimizer.state_dict(),
                    "scaler": self.scaler.state_dict(), "torch_rng": rng_states}, self.run.state)
        save_weights(self.model, self.run.last, metadata)
        for old in removed:
            (self.run.checkpoints / old).unlink(missing_ok=True)

    def resume(self) -> None:
        state = load_state(self.run.state)
        try:
            self.progress = Progress(**state["progress"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scaler.load_state_dict(state["scaler"])
            rng_states = state["torch_rng"]
        except (KeyError, TypeError, ValueError) as error:
            raise UserError(f"{self.run.state} is not a valid attnmt trainer state ({error})") from None
        if self.progress.world != self.cluster.world:
            raise UserError(f"{self.run.path} was trained by {self.progress.world} process(es); "
                            f"resume it with the same number, not {self.cluster.world}")
        torch.set_rng_state(rng_states[self.cluster.rank])
        load_weights(self.model, self.run.checkpoints / self.progress.checkpoints[-1])
        if self.cluster.is_main:
            self._truncate_log(self.progress.step)

    def _truncate_log(self, step: int) -> None:
        """Drop log rows written after the checkpoint we resume from (they will be redone)."""
        if not self.run.log.is_file():
            return
        with open(self.run.log, newline="") as handle:
            rows = [row for row in csv.DictReader(handle) if int(row["step"]) <= step]
        with open(self.run.log, "w", newline="") as handle:
            writer = csv.DictWriter(handle, LOG_COLUMNS)
            writer.writeheader()
            writer.writerows(rows)

    def log(self, row: dict) -> None:
        """One row of ``log.csv`` (and TensorBoard scalars when it is installed); rank 0 only."""
        if not self.cluster.is_main:
            return
        new = not self.run.log.is_file()
        with open(self.run.log, "a", newline="") as handle:
            writer = csv.DictWriter(handle, LOG_COLUMNS)
            if new:
                writer.writeheader()
            writer.writerow({key: row.get(key, "") for key in LOG_COLUMNS})
        if self.tensorboard is not None:
            for key in LOG_COLUMNS[2:]:
                if row.get(key, "") != "":
                    self.tensorboard.add_scalar(key, float(row[key]), row["step"])
            self.tensorboard.flush()

    # --- the loop --------------------------------------------------------------------------

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def batch_stream(self):
        """This rank's training batches from the saved data position on, epoch after epoch."""
        while True:
            batches = token_batches(self.train_split.src_lengths, self.train_split.tgt_lengths,
                                    self.train_config.batch_tokens, self.train_config.seed,
                                    self.progress.epoch)
            batches = shard_batches(batches, self.cluster.rank, self.cluster.world)
            while self.progress.batch_in_epoch < len(batches):
                index = self.progress.batch_in_epoch
                self.progress.batch_in_epoch += 1
                yield self.train_split.batch(batches[index])
            self.progress.epoch += 1
            self.progress.batch_in_epoch = 0

    def loss(self, batch, label_smoothing: float, module: nn.Module | None = None) -> torch.Tensor:
        """Summed token cross-entropy of one batch (float32)."""
        module = module or self.loss_module
        with self.autocast():
            return module(*(tensor.to(self.device) for tensor in
                            (batch.src, batch.src_mask, batch.tgt_in, batch.tgt_mask, batch.tgt_out)),
                          label_smoothing)

    def train_step(self, batches) -> tuple[float, int]:
        """One update over ``accumulate`` batches on every rank.

        Gradients are those of the summed loss over all ranks' target tokens divided by
        their count, exactly as one process would compute them on the union of the batches.
        Returns (loss per target token, target tokens), both over all ranks.
        """
        self.model.train()
        local_tokens = sum(batch.target_tokens for batch in batches)
        (tokens,) = all_reduce_sum([float(local_tokens)], self.cluster, self.device)
        scale = self.cluster.world / tokens          # DDP averages gradients over ranks
        total = 0.0
        for number, batch in enumerate(batches, start=1):
            synchronise = number == len(batches) or not self.cluster.active
            with contextlib.nullcontext() if synchronise else self.loss_module.no_sync():
                loss = self.loss(batch, self.train_config.label_smoothing)
                self.scaler.scale(loss * scale).backward()
            total += loss.item()
        self.scaler.unscale_(self.optimizer)
        if self.train_config.clip_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.train_config.clip_norm)
        self.progress.step += 1
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.progress.step, self.train_config,
                                        self.progress.plateau_scale)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        (total,) = all_reduce_sum([total], self.cluster, self.device)
        return total / tokens, int(tokens)

    def should_stop(self) -> bool:
        """Budgets and early stopping, decided by rank 0 for every rank."""
        config, progress = self.train_config, self.progress
        stop = bool(progress.finished
                    or (config.max_steps and progress.step >= config.max_steps)
                    or (config.max_epochs and progress.epoch >= config.max_epochs)
                    or (config.max_minutes and progress.elapsed >= config.max_minutes * 60))
        return broadcast_object(stop, self.cluster)

    def fit(self) -> Progress:
        if self.run.exists():
            self.resume()
            if self.cluster.is_main:
                say(f"resuming {self.run.path} at step {self.progress.step}")
        stream = self.batch_stream()
        bar = tqdm(initial=self.progress.step, total=self.train_config.max_steps or None,
                   unit="step", dynamic_ncols=True, disable=None if self.cluster.is_main else True)
        window_loss, window_steps, window_tokens, window_time = 0.0, 0, 0, 0.0
        stop = self.should_stop()
        while not stop:
            start = time.perf_counter()
            batches = [next(stream) for _ in range(self.train_config.accumulate)]
            loss, tokens = self.train_step(batches)
            seconds = time.perf_counter() - start
            self.progress.elapsed += seconds          # validation time is added below
            window_loss, window_steps = window_loss + loss, window_steps + 1
            window_tokens, window_time = window_tokens + tokens, window_time + seconds
            lr = self.optimizer.param_groups[0]["lr"]
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens / seconds:.0f}")
            row = {}
            if self.progress.step % self.train_config.log_every == 0:
                row = {"loss": f"{window_loss / window_steps:.6f}",
                       "tokens_per_s": f"{window_tokens / window_time:.1f}"}
                window_loss, window_steps, window_tokens, window_time = 0.0, 0, 0, 0.0
            stop = self.should_stop()
            if self.progress.step % self.train_config.validate_every == 0 or stop:
                row.update(self.validate(time.perf_counter()))
                stop = self.should_stop()
            if row:
                self.log({"step": self.progress.step, "epoch": self.progress.epoch, "lr": f"{lr:.6g}",
                          "elapsed_s": f"{self.progress.elapsed:.1f}", **row})
        bar.close()
        if self.cluster.is_main:
            self.finish()
        barrier(self.cluster)
        return self.progress

    def finish(self) -> None:
        """Average the last checkpoints into best.safetensors when asked."""
        count = self.train_config.average_checkpoints
        if count > 1 and len(self.progress.checkpoints) > 1:
            names = self.progress.checkpoints[-count:]
            average_into(self.model, [self.run.checkpoints / name for name in names])
            save_weights(self.model, self.run.best, {"averaged": ",".join(names), "format": "attnmt"})
            say(f"best.safetensors = average of {', '.join(names)}")

    # --- validation ------------------------------------------------------------------------

    @torch.no_grad()
    def validation_loss(self) -> float:
        """Mean token cross-entropy on the validation set, without label smoothing."""
        self.model.eval()
        split = self.valid_split
        total, tokens = 0.0, 0
        plain = TrainingLoss(self.model)                    # no DDP: rank 0 validates alone
        for indices in token_batches(split.src_lengths, split.tgt_lengths,
                                     self.train_config.batch_tokens, shuffle=False):
            batch = split.batch(indices)
            total += self.loss(batch, 0.0, plain).item()
            tokens += batch.target_tokens
        return total / max(tokens, 1)

    def validate(self, start: float) -> dict:
        """Validation loss, perplexity and greedy BLEU by rank 0; early stopping decided there
        and shared; a checkpoint. Validation time counts toward ``train.max_minutes``."""
        scores = self._validate_on_main() if self.cluster.is_main else None
        self.progress.elapsed += time.perf_counter() - start
        shared = broadcast_object((scores, asdict(self.progress)), self.cluster)
        scores, self.progress = shared[0], Progress(**shared[1])
        self.save_checkpoint(scores.pop("improved"))
        return scores

    def _validate_on_main(self) -> dict:
        valid_loss = self.validation_loss()
        bleu = validation_bleu(self.model, self.valid_split, self.tokenizers[1], self.config,
                               self.device, self.autocast)
        metric = bleu if self.train_config.early_stop_metric == "bleu" else -valid_loss
        improved = self.progress.best is None or metric > self.progress.best
        if improved:
            self.progress.best, self.progress.bad_validations = metric, 0
        else:
            self.progress.bad_validations += 1
            if self.train_config.schedule == "plateau" and \
                    self.progress.bad_validations % self.train_config.plateau_patience == 0:
                self.progress.plateau_scale *= self.train_config.plateau_factor
            if self.train_config.patience and \
                    self.progress.bad_validations >= self.train_config.patience:
                self.progress.finished = True
        say(f"step {self.progress.step}: valid loss {valid_loss:.4f}  "
            f"ppl {math.exp(min(valid_loss, 50)):.2f}  BLEU {bleu:.2f}"
            f"{'  (best)' if improved else ''}  [{self.progress.elapsed / 60:.1f} min]")
        return {"valid_loss": f"{valid_loss:.6f}", "valid_ppl": f"{math.exp(min(valid_loss, 50)):.4f}",
                "valid_bleu": f"{bleu:.4f}", "improved": improved}


def _tensorboard_writer(folder: Path):
    """A TensorBoard writer when the optional ``tensorboard`` package is installed, else None."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(folder))


def validation_bleu(model: Seq2Seq, split: TokenizedSplit, target_tokenizer, config: Config,
                    device: torch.device, autocast) -> float:
    """Greedy-decoded sacreBLEU of the validation set against its raw references."""
    model.eval()
    hypotheses = [""] * len(split)
    for indices in source_batches(split.src_lengths.tolist(), config.decode.batch_tokens):
        src, src_mask = source_tensor([split.sources[i] for i in indices])
        with autocast():
            results = greedy_search(model, src.to(device), src_mask.to(device),
                                    config.decode.max_len_a, config.decode.max_len_b)
        for index, hypothesis in zip(indices, results):
            hypotheses[index] = target_tokenizer.decode(hypothesis.tokens)
    return corpus_bleu(hypotheses, split.corpus.target)


def train(config_path: str | Path, run_dir: str | Path | None = None, overrides=()) -> Path:
    """Train (or resume) the run described by a config file; returns the run directory."""
    config = load_config(config_path, overrides)
    return train_config(config, Path(run_dir) if run_dir else Path("runs") / Path(config_path).stem)


def train_config(config: Config, run_dir: Path) -> Path:
    """Train (or resume) a run of ``config`` in ``run_dir``."""
    run = open_run(config, run_dir)
    trainer = Trainer(config, run)
    if trainer.cluster.is_main:
        save_config(config, run.config)
    try:
        trainer.fit()
    finally:
        shutdown(trainer.cluster)
    return run.path


