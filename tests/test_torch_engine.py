"""The PyTorch engine's ensembles: the mean of the runs' log-probabilities at every step."""

import shutil

import pytest
import torch

from attnmt.errors import UserError
from attnmt.search import beam_search, greedy_search
from attnmt.torch_engine import Ensemble
from attnmt.train import train
from attnmt.translator import Translator

from conftest import TINY, make_model, toy_batch

TEXTS = ["dreihundertzwölf", "sieben", "", "neunhundertneunundneunzig", "zweiundvierzig"]


def outputs(translator, **options):
    return [[(h.ids, round(h.score, 5)) for h in t.hypotheses]
            for t in translator.translate(TEXTS, **options)]


def test_ensemble_step_is_the_mean_of_the_models_log_probabilities():
    first, second = make_model("transformer-post", 0), make_model("bahdanau-additive", 1)
    ensemble = Ensemble([first, second]).eval()
    src, src_mask, _, _ = toy_batch()
    prev = torch.tensor([1, 5, 7])
    with torch.no_grad():
        combined, state, attention = ensemble.decode_step(prev, None, ensemble.encode(src, src_mask))
        alone = [model.decode_step(prev, None, model.encode(src, src_mask))[0] for model in (first, second)]
    torch.testing.assert_close(combined, (alone[0] + alone[1]) / 2)
    assert attention.shape == (3, 1, 1, src.size(1))            # grids differ: last layer, heads averaged
    with torch.no_grad():                                       # the states go on, one per model
        after, _, _ = ensemble.decode_step(prev, state, ensemble.encode(src, src_mask))
    assert after.shape == combined.shape and not torch.equal(after, combined)


@pytest.mark.parametrize("beam", [1, 4])
def test_an_ensemble_of_one_model_or_of_two_copies_searches_like_the_model(beam):
    model = make_model("transformer-post", 3)
    copy = make_model("transformer-post", 3)
    src, src_mask, _, _ = toy_batch(2)

    def search(candidate):
        with torch.no_grad():
            if beam == 1:
                return [(h.tokens, round(h.score, 5)) for h in greedy_search(candidate, src, src_mask)]
            return [[(h.tokens, round(h.score, 5)) for h in found]
                    for found in beam_search(candidate, src, src_mask, beam=beam, n_best=2)]
    expected = search(model)
    assert search(Ensemble([model]).eval()) == expected
    assert search(Ensemble([model, copy]).eval()) == expected


def test_translating_with_two_copies_of_a_run_equals_the_run(tiny_runs, tmp_path):
    run = tiny_runs["transformer"]
    twin = tmp_path / "twin"
    shutil.copytree(run, twin)
    alone, pair = Translator.from_run(run), Translator.from_runs([run, twin])
    assert pair.engine.description.startswith("ensemble of 2")
    for options in (dict(beam=1), dict(beam=3, n_best=2)):
        assert outputs(pair, **options) == outputs(alone, **options)


def test_runs_with_other_vocabularies_or_languages_are_refused(tiny_runs, tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    other = train(tmp_path / "tiny.yaml", tmp_path / "other", ["train.max_steps=1",
                                                              "data.vocab_size=60"])
    with pytest.raises(UserError, match=r"^cannot ensemble .* their source vocabularies differ"):
        Translator.from_runs([tiny_runs["transformer"], other])
    french = train(tmp_path / "tiny.yaml", tmp_path / "french", ["train.max_steps=1",
                                                                "data.tgt_lang=fr"])
    with pytest.raises(UserError, match=r"^cannot ensemble .*\(de->en\) with .*\(de->fr\)$"):
        Translator.from_runs([tiny_runs["transformer"], french])
    with pytest.raises(UserError, match="an ensemble of runs translates on the PyTorch engine only"):
        Translator.from_runs([tiny_runs["transformer"]] * 2, engine="ctranslate2")


def test_an_ensemble_of_architectures_translates(tiny_runs):
    mixed = Translator.from_runs([tiny_runs["transformer"], tiny_runs["rnn"]])
    found = mixed.translate(TEXTS, beam=3, need_attention=True)
    assert found[2].best.text == "" and all(t.best.ids for i, t in enumerate(found) if i != 2)
    assert found[0].best.attention.shape[1:3] == (1, 1)
