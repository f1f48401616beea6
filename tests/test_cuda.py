"""The GPU paths, run where CUDA exists (they skip with a message elsewhere).

No GPU was available when they were written: these are the checks the first machine with
one runs, for what could only be fixed by reading the code.
"""

import pytest
import torch

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


def test_training_on_cuda_resumes_its_cuda_random_state(tiny_config, tmp_path):
    config = load_config(tiny_config, ["train.device=cuda", "train.max_steps=4",
                                       "train.validate_every=2", "train.precision=auto"])
    run = RunDirectory(tmp_path / "run")
    run.path.mkdir()
    trainer = Trainer(config, run, prepare_data(config, run))
    trainer.fit()
    state = torch.load(run.state, weights_only=True, map_location="cpu")
    cpu_state, cuda_state = state["rng"][0]
    assert cuda_state is not None                       # dropout on the GPU is resumable
    capability = torch.cuda.get_device_capability()
    expected = torch.bfloat16 if capability >= (8, 0) else torch.float16
    assert trainer.autocast_dtype is expected           # native bf16 only, else fp16 + scaling
