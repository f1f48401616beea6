"""Training: ``attnmt train CONFIG [--run DIR] [--set section.key=value ...]``.

Training on an existing run directory resumes it exactly: the same batches, the
same dropout masks, the same losses as a run that was never interrupted (with a step
budget; a time budget depends on the machine's speed, see records/configuration.md).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from attnmt.averaging import ExponentialMovingAverage
from attnmt.checkpoint import average_into, load_state, load_weights, save_state, save_weights
from attnmt.config import Config, load_config, save_config
from attnmt.data import PAD_ID
from attnmt.data.batching import source_batches, token_batches
from attnmt.data.tensors import source_tensor
from attnmt.data.datasets import (TokenizedSplit, load_segmentation, resample_subwords,
                                  save_segmentation)
from attnmt.distributed import (Cluster, all_reduce_sum, barrier, broadcast_object, gather_objects,
                                init_cluster, shard_batches, shutdown)
from attnmt.dropout import drop_source_words
from attnmt.errors import UserError
from attnmt.evaluate import corpus_bleu
from attnmt.loss import projected_cross_entropy
from attnmt.masks import padding_mask, target_mask
from attnmt.model import Seq2Seq, build_model
from attnmt.process import resolve_device, resolve_precision
from attnmt.run import (RunDirectory, TrainingData, changed_settings, default_run_dir, inherit,
                        open_run, prepare_data, say)
from attnmt.schedule import budget_progress, learning_rate
from attnmt.search import greedy_search
from attnmt.transformer import FeedForward


@dataclass
class Progress:
    """Where training stands; saved with every checkpoint for exact resume."""
    step: int = 0
    epoch: int = 0                       # passes over the training data done
    batch_in_epoch: int = 0              # index of the next batch of this epoch
    train_seconds: float = 0.0           # training time over all sessions: the time budget
    elapsed: float = 0.0                 # that plus validation and checkpoints
    best: float | None = None            # best validation metric
    bad_validations: int = 0
    plateau_scale: float = 1.0
    checkpoints: list[str] = field(default_factory=list)
    finished: bool = False               # stopped early: no improvement for `patience` validations
    world: int = 1                       # processes that trained the run (resume needs as many)
    pad_multiple: int = 0                # the batches' padding chosen at the start (0: unknown)
    real_only_from_epoch: int | None = None  # the first pass without synthetic pairs (data.synthetic_until)


class TrainingLoss(nn.Module):
    """The summed training loss of a batch as a module, so DistributedDataParallel can wrap it."""

    def __init__(self, model: Seq2Seq):
        super().__init__()
        self.model = model

    def forward(self, src, tgt_in, tgt_out, label_smoothing: float, rdrop: float = 0.0):
        """Summed token cross-entropy of ``src (B, S)``, ``tgt_in (B, T)``, ``tgt_out (B, T)``.

        ``rdrop > 0``: R-Drop (Liang et al., NeurIPS 2021). The batch goes through the model
        twice in one call, with independent dropout masks; the loss is the mean of the two
        cross-entropies plus ``rdrop / 4`` times KL(p1 || p2) + KL(p2 || p1) summed over target
        tokens: the paper's loss with weight ``alpha = rdrop``, halved so that its
        cross-entropy part matches one pass's.
        """
        if rdrop:
            src, tgt_in = src.repeat(2, 1), tgt_in.repeat(2, 1)
        hidden = self.model.features(src, padding_mask(src, PAD_ID), tgt_in, target_mask(tgt_in, PAD_ID))
        if not rdrop:
            return projected_cross_entropy(hidden.flatten(0, 1), self.model.generator,
                                           tgt_out.flatten(), label_smoothing, PAD_ID)
        # The KL terms need every probability, so the projection is done once, whole; the
        # cross-entropy of log-probabilities equals that of the logits (log_softmax is idempotent).
        log_probs = torch.log_softmax(self.model.generator(hidden).float(), dim=-1)   # (2B, T, V)
        cross_entropy = F.cross_entropy(log_probs.flatten(0, 1), tgt_out.repeat(2, 1).flatten(),
                                        label_smoothing=label_smoothing, ignore_index=PAD_ID,
                                        reduction="sum")
        first, second = log_probs.chunk(2)
        divergences = ((first.exp() - second.exp()) * (first - second)).sum(-1)   # (B, T)
        return cross_entropy / 2 + rdrop / 4 * (divergences * (tgt_out != PAD_ID)).sum()


@dataclass
class Scores:
    """One validation of one set of weights."""
    loss: float
    bleu: float

    def metric(self, early_stop_metric: str) -> float:
        return self.bleu if early_stop_metric == "bleu" else -self.loss


def default_pad_multiple(autocast_dtype: torch.dtype | None, arch: str, device: torch.device) -> int:
    """8 for a Transformer in bf16/fp16 on a GPU or on a CPU with AMX, where a kernel per
    matrix shape is costly and padding keeps the shapes few; else 1. Without AMX, oneDNN's
    bf16 kernels for new shapes are cheap and padding's extra positions cost more (a 2-core
    x86 CPU with AVX-512 BF16: 3,458 target tokens/s exact, 3,074 padded); an RNN's step
    shapes do not depend on the length, and padding adds time steps."""
    if autocast_dtype is None or arch != "transformer":
        return 1
    return 8 if device.type == "cuda" or torch.cpu._is_amx_tile_supported() else 1


def parameter_groups(model: nn.Module, weight_decay_on: str) -> list[dict]:
    """The optimizer's parameter groups. ``weight_decay_on`` "all": one group, every weight
    decays; "matrices": the weights of one dimension (biases, LayerNorm gains and shifts) form
    a second group with weight decay 0."""
    parameters = list(model.parameters())
    if weight_decay_on == "all":
        return [{"params": parameters}]
    return [{"params": [p for p in parameters if p.dim() >= 2]},
            {"params": [p for p in parameters if p.dim() < 2], "weight_decay": 0.0}]


class Trainer:
    """The training loop of one run. ``data`` comes from :func:`attnmt.run.prepare_data`;
    ``clock`` measures training time (tests pass a fake one)."""

    def __init__(self, config: Config, run: RunDirectory, data: TrainingData,
                 cluster: Cluster = Cluster(), clock=time.perf_counter):
        self.config, self.train_config, self.run, self.data = config, config.train, run, data
        self.cluster, self.clock = cluster, clock
        device = resolve_device(self.train_config.device)
        self.device = torch.device("cuda", cluster.local_rank) if device.type == "cuda" else device
        self.autocast_dtype = resolve_precision(self.train_config.precision, self.device)
        self.pad_multiple = (self.train_config.pad_multiple
                             or default_pad_multiple(self.autocast_dtype, config.model.arch, self.device))
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.autocast_dtype == torch.float16)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        torch.manual_seed(self.train_config.seed)          # the same initial weights everywhere
        self.model = build_model(config.model, data.source_tokenizer.vocab_size,
                                 data.target_tokenizer.vocab_size).to(self.device)
        start = RunDirectory(config.train.init_from) if config.train.init_from else None
        if start is not None and not run.exists():        # a resumed run loads its own
            start.restore(self.model, config.train.init_checkpoint)
            if cluster.is_main:
                which = ("an export, its weights read back from int8" if start.is_export()
                         else config.train.init_checkpoint)
                say(f"fine-tuning from {start.path} ({which})")
        if cluster.rank:                                  # different dropout on every rank
            torch.manual_seed(self.train_config.seed + 7919 * cluster.rank)
        self.ffn_dropouts = [module.hidden_dropout for module in self.model.modules()
                             if isinstance(module, FeedForward)]
        self.loss_module = TrainingLoss(self.model)
        if cluster.active:
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            self.loss_module = DistributedDataParallel(self.loss_module, device_ids=device_ids)
        if self.train_config.compile:
            self.loss_module = torch.compile(self.loss_module, dynamic=True)
        optimizer_class = torch.optim.AdamW if self.train_config.optimizer == "adamw" else torch.optim.Adam
        self.optimizer = optimizer_class(parameter_groups(self.model, self.train_config.weight_decay_on),
                                         lr=self.train_config.lr,
                                         betas=self.train_config.betas, eps=1e-9,
                                         weight_decay=self.train_config.weight_decay)
        self.average = (ExponentialMovingAverage(self.model, self.train_config.ema_decay)
                        if self.train_config.ema_decay else None)
        self.progress = Progress(world=cluster.world, pad_multiple=self.pad_multiple)
        self.epoch_split: tuple[int, TokenizedSplit] | None = None
        self.epoch_batches = 0                            # this rank's batches in the current pass
        self.tensorboard = _tensorboard_writer(run.path / "tensorboard") if cluster.is_main else None

    # --- checkpoints -----------------------------------------------------------------------

    def rng_state(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        cuda = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        return torch.get_rng_state(), cuda

    def save_checkpoint(self, best: str | None) -> None:
        """Called on every rank (the RNG states are gathered); rank 0 writes. ``best``: which
        weights become ``best.safetensors`` (``model`` or ``average``), or None."""
        rng_states = gather_objects(self.rng_state(), self.cluster)
        if not self.cluster.is_main:
            return
        self.run.checkpoints.mkdir(exist_ok=True)
        path = self.run.checkpoint(self.progress.step)
        metadata = {"step": str(self.progress.step), "format": "attnmt"}
        save_weights(self.model, path, metadata)
        if best == "model":
            save_weights(self.model, self.run.best, metadata)
        elif best == "average":
            with self.average.applied(self.model):
                save_weights(self.model, self.run.best, {**metadata, "weights": "moving average"})
        if path.name not in self.progress.checkpoints:
            self.progress.checkpoints.append(path.name)
        keep = self.train_config.keep_checkpoints
        removed, self.progress.checkpoints = self.progress.checkpoints[:-keep], self.progress.checkpoints[-keep:]
        save_state({"progress": asdict(self.progress), "optimizer": self.optimizer.state_dict(),
                    "scaler": self.scaler.state_dict(), "rng": rng_states,
                    "average": None if self.average is None else self.average.state_dict()},
                   self.run.state)
        save_weights(self.model, self.run.last, metadata)
        for old in removed:
            (self.run.checkpoints / old).unlink(missing_ok=True)
        self.run.drop_segmentations_before(self.progress.epoch)

    def load_optimizer(self, saved: dict) -> None:
        """Load the saved moments of the optimizer; its settings (weight decay, betas) stay the
        config's, which a resumed run may change like its other train settings."""
        settings = [{key: value for key, value in group.items() if key != "params"}
                    for group in self.optimizer.param_groups]
        if len(saved["param_groups"]) != len(settings):
            raise UserError(f"{self.run.state} holds the optimizer state of "
                            f"{len(saved['param_groups'])} parameter group(s), but "
                            f"train.weight_decay_on: {self.train_config.weight_decay_on} makes "
                            f"{len(settings)}; resume with the weight_decay_on the run was trained with")
        self.optimizer.load_state_dict(saved)
        for group, setting in zip(self.optimizer.param_groups, settings):
            group.update(setting)

    def resume(self) -> None:
        state = load_state(self.run.state)
        try:
            self.progress = Progress(**state["progress"])
            self.load_optimizer(state["optimizer"])
            self.scaler.load_state_dict(state["scaler"])
            cpu_state, cuda_state = state["rng"][self.cluster.rank]
            if self.average is not None:
                self.average.load_state_dict(state["average"])
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as error:
            raise UserError(f"{self.run.state} is not a valid attnmt trainer state for this "
                            f"config ({type(error).__name__}: {error})") from None
        if not self.train_config.pad_multiple and self.progress.pad_multiple:
            self.pad_multiple = self.progress.pad_multiple   # the automatic choice of another machine
        self.progress.pad_multiple = self.pad_multiple
        if self.progress.world != self.cluster.world:
            raise UserError(f"{self.run.path} was trained by {self.progress.world} process(es); "
                            f"resume it with the same number, not {self.cluster.world}")
        torch.set_rng_state(cpu_state)
        if cuda_state is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(cuda_state, self.device)
        load_weights(self.model, self.run.checkpoints / self.progress.checkpoints[-1])
        if self.cluster.is_main:
            self.run.truncate_log(self.progress.step)

    def log(self, row: dict) -> None:
        """One row of ``log.csv`` (and TensorBoard scalars when it is installed); rank 0 only."""
        if not self.cluster.is_main:
            return
        self.run.append_log(row)
        if self.tensorboard is not None:
            for key, value in row.items():
                if key != "step" and value != "":
                    self.tensorboard.add_scalar(key, float(value), row["step"])
            self.tensorboard.flush()

    # --- the loop --------------------------------------------------------------------------

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def training_split(self, epoch: int):
        """The training split of ``epoch``. With ``data.subword_sampling`` it is segmented anew
        for each epoch from ``data.subword_sampling_from_epoch`` on, by rank 0, and saved in the
        run directory, where every rank (and a resumed run) reads it: SentencePiece's sampler
        cannot be seeded across processes. Earlier epochs use the fixed segmentation."""
        data = self.config.data
        real_only = self.progress.real_only_from_epoch
        pairs = self.data.real if real_only is not None and epoch >= real_only else self.data.train
        if not data.subword_sampling or epoch < data.subword_sampling_from_epoch:
            return pairs
        if self.epoch_split is None or self.epoch_split[0] != epoch:
            path = self.run.segmentation(epoch)
            if self.cluster.is_main and not path.is_file():
                path.parent.mkdir(exist_ok=True)
                save_segmentation(resample_subwords(pairs, self.data.source_tokenizer,
                                                    self.data.target_tokenizer,
                                                    data.subword_sampling, data.subword_nbest), path)
            barrier(self.cluster)
            self.epoch_split = (epoch, load_segmentation(pairs, path))
        return self.epoch_split[1]

    def synthetic_ends_now(self) -> bool:
        """Whether the budget used has reached ``data.synthetic_until`` with synthetic pairs
        still in the mix. Decided from the progress alone, so a resumed run ends them at the
        same batch as an unbroken one (with a step or pass budget)."""
        return (self.data.real is not None and self.progress.real_only_from_epoch is None
                and self.budget_progress() >= self.config.data.synthetic_until)

    def end_synthetic(self) -> None:
        """From the next pass on, train on the real pairs alone; the rest of the current
        pass (if one is under way) is left out."""
        if self.progress.batch_in_epoch:
            self.progress.epoch, self.progress.batch_in_epoch = self.progress.epoch + 1, 0
        self.progress.real_only_from_epoch = self.progress.epoch
        if self.cluster.is_main:
            say(f"step {self.progress.step}: {self.budget_progress():.0%} of the budget used, the "
                f"synthetic pairs end; {len(self.data.real)} real pairs from pass {self.progress.epoch} on")

    def batch_stream(self):
        """This rank's training batches from the saved data position on, epoch after epoch."""
        while True:
            if self.synthetic_ends_now():
                self.end_synthetic()
            split = self.training_split(self.progress.epoch)
            batches = token_batches(split.src_lengths, split.tgt_lengths,
                                    self.train_config.batch_tokens, self.train_config.seed,
                                    self.progress.epoch, pad_multiple=self.pad_multiple)
            batches = shard_batches(batches, self.cluster.rank, self.cluster.world)
            self.epoch_batches = len(batches)
            if self.progress.batch_in_epoch >= len(batches):   # saved at a pass's end by earlier versions
                self.progress.epoch, self.progress.batch_in_epoch = self.progress.epoch + 1, 0
                continue
            for index in range(self.progress.batch_in_epoch, len(batches)):
                if self.synthetic_ends_now():
                    break
                last = index + 1 == len(batches)       # a pass counts as done with its last batch
                self.progress.epoch += last
                self.progress.batch_in_epoch = 0 if last else index + 1
                yield split.batch(batches[index], self.pad_multiple)

    def loss(self, batch, label_smoothing: float, module: nn.Module | None = None,
             rdrop: float = 0.0) -> torch.Tensor:
        """Summed token cross-entropy of one batch (float32; R-Drop's loss with ``rdrop > 0``);
        masks are built on the device."""
        module = module or self.loss_module
        with self.autocast():
            return module(*(tensor.to(self.device) for tensor in (batch.src, batch.tgt_in, batch.tgt_out)),
                          label_smoothing, rdrop)

    def passes(self) -> float:
        """Passes over the training data so far, the current one counted by its batches done."""
        done = self.progress.batch_in_epoch / self.epoch_batches if self.epoch_batches else 0.0
        return self.progress.epoch + done

    def budget_progress(self) -> float:
        return budget_progress(self.progress.step, self.progress.train_seconds, self.passes(),
                               self.train_config)

    def batch_epoch(self) -> int:
        """The pass of the last batch just taken from ``batch_stream`` (a pass counts as done
        once its last batch is taken)."""
        return self.progress.epoch - (self.progress.batch_in_epoch == 0)

    def rdrop_started(self) -> bool:
        """Whether the update of the batches just taken uses R-Drop: their pass is
        ``train.rdrop_from_epoch`` or later, and the budget used is ``train.rdrop_from`` or more."""
        config = self.train_config
        return self.budget_progress() >= config.rdrop_from and self.batch_epoch() >= config.rdrop_from_epoch

    def set_ffn_dropout(self) -> None:
        """``model.ffn_dropout`` on the FFN hidden layers for the batches just taken if their
        pass is ``train.ffn_dropout_from_epoch`` or later, none before it. Only the trainer
        changes it, from its progress, so a resumed run drops the same as an unbroken one."""
        started = self.batch_epoch() >= self.train_config.ffn_dropout_from_epoch
        for dropout in self.ffn_dropouts:
            dropout.p = self.config.model.ffn_dropout if started else 0.0

    def train_step(self, batches) -> tuple[float, int]:
        """One update over ``accumulate`` batches on every rank.

        Gradients are those of the summed loss over all ranks' target tokens divided by
        their count, exactly as one process would compute them on the union of the batches.
        Returns (this rank's summed loss, target tokens over all ranks).
        """
        self.model.train()
        local_tokens = sum(batch.target_tokens for batch in batches)
        (tokens,) = all_reduce_sum([float(local_tokens)], self.cluster, self.device)
        scale = self.cluster.world / tokens          # DDP averages gradients over ranks
        config = self.train_config
        rdrop = config.rdrop if self.rdrop_started() else 0.0
        self.set_ffn_dropout()
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for number, batch in enumerate(batches, start=1):
            synchronise = number == len(batches) or not self.cluster.active
            batch = replace(batch, src=drop_source_words(batch.src, config.source_word_dropout))
            with contextlib.nullcontext() if synchronise else self.loss_module.no_sync():
                loss = self.loss(batch, config.label_smoothing, rdrop=rdrop)
                self.scaler.scale(loss * scale).backward()
            total += loss.detach()
        self.scaler.unscale_(self.optimizer)
        if self.train_config.clip_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.train_config.clip_norm)
        self.progress.step += 1
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.progress.step, self.train_config, self.budget_progress(),
                                        self.progress.plateau_scale)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.average is not None:
            self.average.update(self.model, self.progress.step)
        return total.item(), int(tokens)

    def share_step(self, local_loss: float, seconds: float) -> tuple[float, float]:
        """The summed loss over all ranks and rank 0's time for the step, in one collective.

        Every rank adds rank 0's time to its clock, so the schedule's progress (and with it
        the learning rate) and the time budget are the same on every rank: the replicas stay
        equal and stop at the same step without a message of their own.
        """
        main_seconds = seconds if self.cluster.is_main else 0.0
        loss, seconds = all_reduce_sum([local_loss, main_seconds], self.cluster, self.device)
        return loss, seconds

    def should_stop(self) -> bool:
        """Budgets and early stopping. Every rank holds the same progress (rank 0's step
        times, validation outcomes shared), so every rank decides alike."""
        config, progress = self.train_config, self.progress
        return bool(progress.finished
                    or (config.max_steps and progress.step >= config.max_steps)
                    or (config.max_epochs and progress.epoch >= config.max_epochs)
                    or (config.max_minutes and progress.train_seconds >= config.max_minutes * 60))

    def fit(self) -> Progress:
        if self.run.exists():
            self.resume()
            if self.cluster.is_main:
                say(f"resuming {self.run.path} at step {self.progress.step}")
                say_replaced_decoding(load_config(self.run.config), self.config)
                save_config(self.config, self.run.config)   # only now: a refused resume changes nothing
        stream = self.batch_stream()
        bar = tqdm(initial=self.progress.step, total=self.train_config.max_steps or None,
                   unit="step", dynamic_ncols=True, disable=None if self.cluster.is_main else True)
        window_loss, window_steps, window_tokens, window_time = 0.0, 0, 0, 0.0
        stop = self.should_stop()
        while not stop:
            start = self.clock()
            batches = [next(stream) for _ in range(self.train_config.accumulate)]
            local_loss, tokens = self.train_step(batches)
            loss, seconds = self.share_step(local_loss, self.clock() - start)
            loss /= tokens
            self.progress.train_seconds += seconds
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
                row.update(self.validate(self.clock()))
                stop = self.should_stop()
            if row:
                self.log({"step": self.progress.step, "epoch": self.progress.epoch,
                          "progress": f"{self.budget_progress():.4f}", "lr": f"{lr:.6g}",
                          "train_s": f"{self.progress.train_seconds:.1f}",
                          "elapsed_s": f"{self.progress.elapsed:.1f}", **row})
        bar.close()
        if self.cluster.is_main:
            self.finish()
        barrier(self.cluster)
        return self.progress

    def finish(self) -> None:
        """With ``average_checkpoints``, average the last checkpoints; the average becomes
        ``best.safetensors`` only if it validates better than the best so far."""
        count = self.train_config.average_checkpoints
        if count < 2 or len(self.progress.checkpoints) < 2:
            return
        names = self.progress.checkpoints[-count:]
        average_into(self.model, [self.run.checkpoints / name for name in names])
        metric = self.evaluate().metric(self.train_config.early_stop_metric)
        if self.progress.best is None or metric > self.progress.best:
            save_weights(self.model, self.run.best, {"averaged": ",".join(names), "format": "attnmt"})
            say(f"best.safetensors = average of {', '.join(names)} ({metric:.2f})")
        else:
            say(f"the average of {', '.join(names)} ({metric:.2f}) is not better than the best "
                f"checkpoint ({self.progress.best:.2f}); best.safetensors kept")

    # --- validation ------------------------------------------------------------------------

    @torch.no_grad()
    def validation_loss(self) -> float:
        """Mean token cross-entropy on the validation set, without label smoothing."""
        self.model.eval()
        split = self.data.valid
        total, tokens = 0.0, 0
        plain = TrainingLoss(self.model)                    # no DDP: rank 0 validates alone
        for indices in token_batches(split.src_lengths, split.tgt_lengths,
                                     self.train_config.batch_tokens, shuffle=False,
                                     pad_multiple=self.pad_multiple):
            batch = split.batch(indices, self.pad_multiple)
            total += self.loss(batch, 0.0, plain).item()
            tokens += batch.target_tokens
        return total / max(tokens, 1)

    def evaluate(self) -> Scores:
        """Validation loss and greedy BLEU of the weights the model holds now."""
        loss = self.validation_loss()
        bleu = validation_bleu(self.model, self.data.valid, self.data.target_tokenizer, self.config,
                               self.device, self.autocast)
        return Scores(loss, bleu)

    def validate(self, start: float) -> dict:
        """Validation by rank 0 (of the weights and of their moving average); early stopping
        decided there and shared; a checkpoint. Returns the log columns."""
        outcome = self._validate_on_main() if self.cluster.is_main else None
        self.progress.elapsed += self.clock() - start
        shared = broadcast_object((outcome, asdict(self.progress)), self.cluster)
        (columns, best), self.progress = shared[0], Progress(**shared[1])
        self.save_checkpoint(best)
        return columns

    def _validate_on_main(self) -> tuple[dict, str | None]:
        candidates = {"model": self.evaluate()}
        if self.average is not None:
            with self.average.applied(self.model):
                candidates["average"] = self.evaluate()
        rule = self.train_config.early_stop_metric
        name = max(candidates, key=lambda key: candidates[key].metric(rule))
        metric = candidates[name].metric(rule)
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
        model = candidates["model"]
        message = (f"step {self.progress.step}: valid loss {model.loss:.4f}  "
                   f"ppl {math.exp(min(model.loss, 50)):.2f}  BLEU {model.bleu:.2f}")
        columns = {"valid_loss": f"{model.loss:.6f}", "valid_ppl": f"{math.exp(min(model.loss, 50)):.4f}",
                   "valid_bleu": f"{model.bleu:.4f}"}
        if "average" in candidates:
            average = candidates["average"]
            message += f"  | average: loss {average.loss:.4f}  BLEU {average.bleu:.2f}"
            columns.update(ema_valid_loss=f"{average.loss:.6f}", ema_valid_bleu=f"{average.bleu:.4f}")
        say(f"{message}{f'  (best: {name})' if improved else ''}  "
            f"[{self.progress.train_seconds / 60:.1f} min]")
        return columns, name if improved else None


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
                                    config.decode.max_len_a, config.decode.max_len_b,
                                    longest=model.max_output_tokens)
        for index, hypothesis in zip(indices, results):
            hypotheses[index] = target_tokenizer.decode(hypothesis.tokens)
    return corpus_bleu(hypotheses, split.corpus.target)


def say_replaced_decoding(saved: Config, resumed: Config) -> None:
    """A resumed run's ``config.yaml`` becomes the training's: name the decoding settings it
    replaces (a length penalty chosen with ``evaluate --write-alpha``, say)."""
    changed = changed_settings(saved, resumed, "decode")
    if changed:
        say(f"the run's decoding settings are replaced by this config's: {', '.join(changed)}")


def train(config_path: str | Path, run_dir: str | Path | None = None, overrides=()) -> Path:
    """Train (or resume) the run described by a config file; returns the run directory."""
    config = load_config(config_path, overrides)
    return train_config(config, run_dir or default_run_dir(config_path))


def train_config(config: Config, run_dir: str | Path) -> Path:
    """Train (or resume) a run of ``config`` in ``run_dir``."""
    config = inherit(config, run_dir)
    run = open_run(config, run_dir)
    cluster = init_cluster(resolve_device(config.train.device).type)
    try:
        with run.held() if cluster.is_main else contextlib.nullcontext():
            if cluster.is_main and not run.exists():   # a resumed run saves it once its state is accepted
                save_config(config, run.config)
            Trainer(config, run, prepare_data(config, run, cluster), cluster).fit()
    finally:
        shutdown(cluster)
    return run.path
