"""The GPU paths, run where CUDA exists (they skip with a message elsewhere).

They were written before any GPU was at hand and first passed on an NVIDIA H200
(``benchmarks/cuda_check.sh`` runs them with a short training and decoding on CUDA).
"""

import pytest
import torch
from safetensors.torch import load_file

from attnmt.config import load_config
from attnmt.run import RunDirectory, prepare_data
from attnmt.train import Trainer
from attnmt.translator import Translator

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA device (none here)")


def test_translation_on_cuda_equals_the_cpu(tiny_runs):
    sources = ["sieben", "dreihundertzwölf", "", "zweiundvierzig"]
    for beam in (1, 3):
        cpu = Translator.from_run(tiny_runs["transformer"]).translate(sources, beam=beam)
        gpu = Translator.from_run(tiny_runs["transformer"], device="cuda").translate(sources, beam=beam)
        assert [t.best.ids for t in gpu] == [t.best.ids for t in cpu]


def cuda_trainer(tiny_config, run_dir):
    config = load_config(tiny_config, ["train.device=cuda", "train.max_steps=4", "train.validate_every=2",
                                       "train.precision=auto", "model.dropout=0.3"])
    run = RunDirectory(run_dir)
    run.path.mkdir(exist_ok=True)
    return Trainer(config, run, prepare_data(config, run))


def test_an_interrupted_cuda_run_resumes_its_dropout_exactly(tiny_config, tmp_path):
    # Dropout on the GPU draws from the CUDA generator: unless its state is saved with the
    # checkpoint and restored, the resumed steps draw other masks and the weights differ.
    cuda_trainer(tiny_config, tmp_path / "straight").fit()
    interrupted = cuda_trainer(tiny_config, tmp_path / "interrupted")
    step = interrupted.train_step

    def stop_after_the_checkpoint(batches):
        if interrupted.progress.step == 2:
            raise KeyboardInterrupt
        return step(batches)
    interrupted.train_step = stop_after_the_checkpoint
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit()
    resumed = cuda_trainer(tiny_config, tmp_path / "interrupted")
    resumed.fit()
    assert resumed.progress.step == 4
    ours, reference = (load_file(str(tmp_path / name / "last.safetensors"))
                       for name in ("interrupted", "straight"))
    for name in reference:                  # CUDA kernels may sum in another order: a tolerance
        torch.testing.assert_close(ours[name], reference[name], atol=1e-5, rtol=1e-4)
    capability = torch.cuda.get_device_capability()
    expected = torch.bfloat16 if capability >= (8, 0) else torch.float16
    assert resumed.autocast_dtype is expected           # native bf16 only, else fp16 + scaling
