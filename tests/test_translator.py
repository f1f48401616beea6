import numpy as np
import pytest
import torch

from attnmt.errors import UserError
from attnmt.translator import TranslatedHypothesis, Translation, Translator, hard_alignment


@pytest.fixture(scope="module")
def run(tiny_runs):
    return tiny_runs["transformer"]


def test_translations_keep_input_order_and_handle_empty_text(run):
    translator = Translator.from_run(run)
    texts = ["dreihundertzwölf", "", "sieben", "   ", "neunhundertneunundneunzig"]
    translations = translator.translate(texts, beam=3, n_best=2)
    assert [t.source for t in translations] == texts
    assert translations[1].best.text == "" and translations[3].best.tokens == []
    assert all(len(t.hypotheses) == 2 for t in (translations[0], translations[2]))
    alone = translator.translate([texts[4]], beam=3)[0]
    assert alone.best.text == translations[4].best.text


def test_translator_refuses_bad_requests(run):
    translator = Translator.from_run(run)
    with pytest.raises(UserError, match=r"n-best \(3\) must be between 1 and the beam size \(2\)"):
        translator.translate(["sieben"], beam=2, n_best=3)
    with pytest.raises(UserError, match="input 2 has .* tokens; this model accepts at most 39"):
        translator.translate(["sieben", "sieben " * 60])


def test_translator_refuses_emulated_bf16(run, monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    with pytest.raises(UserError, match="^precision: bf16 is not supported on this cpu; use fp32$"):
        Translator.from_run(run, precision="bf16")


def test_translator_refuses_unknown_precision(run):
    with pytest.raises(UserError, match="^precision must be one of auto, fp32, bf16, fp16; got 'fp8'$"):
        Translator.from_run(run, precision="fp8")


def test_alignment_pairs_are_word_indices(run):
    translator = Translator.from_run(run)
    translation = translator.translate(["dreihundertzwölf"], beam=2, need_attention=True)[0]
    pairs = hard_alignment(translation, translation.best, translator.source_tokenizer,
                           translator.target_tokenizer)
    target_words = len(translation.best.text.split())
    assert pairs and all(i == 0 and 0 <= j < max(target_words, 1) for i, j in pairs)


def test_alignment_maps_pieces_to_words_over_several_words(run):
    # "▁zwei ▁hunde ▁spie len" -> "▁two ▁dog s ▁play": pieces attend as the matrix says;
    # pairs are (source word, target word), from the last layer with heads averaged.
    translator = Translator.from_run(run)
    source_pieces = ["\u2581zwei", "\u2581hunde", "\u2581spie", "len"]
    target_pieces = ["\u2581two", "\u2581dog", "s", "\u2581play"]
    attention = torch.zeros(len(target_pieces) + 1, 2, 2, len(source_pieces) + 1)
    last_layer = torch.tensor([[0.7, 0.1, 0.1, 0.0, 0.1],     # two  -> zwei (word 0)
                               [0.1, 0.6, 0.2, 0.0, 0.1],     # dog  -> hunde (word 1)
                               [0.0, 0.8, 0.1, 0.0, 0.1],     # s    -> hunde (word 1)
                               [0.0, 0.1, 0.2, 0.6, 0.1],     # play -> len, in spielen (word 2)
                               [0.0, 0.0, 0.0, 0.0, 1.0]])    # EOS step
    attention[:, 1, 0], attention[:, 1, 1] = last_layer, last_layer          # both heads
    attention[:, 0] = torch.eye(5)[[4, 3, 2, 1, 0]].unsqueeze(1)             # the first layer: ignored
    hypothesis = TranslatedHypothesis("two dogs play", 0.0, 0.0, target_pieces, [5, 6, 7, 8],
                                      attention.numpy())
    translation = Translation("zwei hunde spielen", source_pieces, [hypothesis])
    pairs = hard_alignment(translation, hypothesis, translator.source_tokenizer,
                           translator.target_tokenizer)
    assert pairs == [(0, 0), (1, 1), (2, 2)]
    # A target-language tag before the text is not a source word: the same attention with a
    # tag column in front gives the same pairs.
    tagged = np.concatenate([np.zeros_like(hypothesis.attention[..., :1]), hypothesis.attention], -1)
    hypothesis.attention = tagged
    translation = Translation("zwei hunde spielen", ["<2en>", *source_pieces], [hypothesis], 1)
    assert hard_alignment(translation, hypothesis, translator.source_tokenizer,
                          translator.target_tokenizer) == [(0, 0), (1, 1), (2, 2)]


def test_one_to_many_model_writes_the_language_its_tag_asks_for(one_to_many_run):
    """A tiny model trained on German number words into English and French: the target
    tag chooses the language of every output (scored against both languages' references)."""
    from sacrebleu.metrics import CHRF

    from attnmt.data.numbers import numbers_corpus

    translator = Translator.from_run(one_to_many_run)
    sizes = {"train": 600, "valid": 40, "test": 40}
    references = {lang: numbers_corpus("test", "de", lang, 999, sizes, 1) for lang in ("en", "fr")}
    sources = references["en"].source
    chrf = CHRF()
    for lang, other in (("en", "fr"), ("fr", "en")):
        outputs = [t.best.text for t in translator.translate(sources, beam=2, target_lang=lang)]
        own = chrf.corpus_score(outputs, [references[lang].target]).score
        foreign = chrf.corpus_score(outputs, [references[other].target]).score
        assert own > foreign + 20, (lang, own, foreign)
    tagged = translator.translate(["sieben"], target_lang="fr", need_attention=True)[0]
    assert tagged.source_tokens[0] == "<2fr>" and tagged.tag_tokens == 1
    assert translator.translate(["sieben"])[0].source_tokens[0] == "<2en>"     # data.tgt_lang
    with pytest.raises(UserError, match=r"^target language 'cs': this model translates de into "
                                        r"en, fr only$"):
        translator.translate(["sieben"], target_lang="cs")


@pytest.mark.parametrize("engine", ["torch", "ctranslate2"])
def test_a_tag_typed_in_the_text_is_text(one_to_many_run, engine):
    # "<2fr> sieben" into English: the model reads its own <2en> and the characters of
    # "<2fr>", never the French tag; pieces, ids and alignment agree.
    if engine == "ctranslate2":
        pytest.importorskip("ctranslate2")
    translator = Translator.from_run(one_to_many_run, engine=engine)
    tags = translator.source_tokenizer.tag_ids
    (typed,) = translator.translate(["<2fr> sieben"], target_lang="en", need_attention=True)
    assert typed.source_ids[0] == tags["<2en>"] and tags["<2fr>"] not in typed.source_ids
    assert typed.source_tokens[0] == "<2en>" and "<2fr>" not in typed.source_tokens
    assert len(typed.source_tokens) == len(typed.source_ids) and typed.tag_tokens == 1
    assert typed.best.attention.shape[-1] == len(typed.source_ids) + 1
    (plain,) = translator.translate(["sieben"], target_lang="en")
    assert typed.source_ids[-len(plain.source_ids) + 1:] == plain.source_ids[1:]


def test_a_bilingual_run_refuses_another_target_language(run):
    translator = Translator.from_run(run)
    assert translator.translate(["sieben"], target_lang="en")[0].source_tokens[0] != "<2en>"
    with pytest.raises(UserError, match=r"^target language 'fr': this model translates de into en only$"):
        translator.translate(["sieben"], target_lang="fr")


def test_prefix_starts_every_output_in_every_search(run):
    from attnmt.decoding import Sampling

    translator = Translator.from_run(run)
    prefix = translator.target_tokenizer.encode("one hundred")
    texts = ["sieben", "dreihundertzwölf", "", "neunhundertneunundneunzig"]
    for options in (dict(beam=1), dict(beam=3, n_best=2), dict(sampling=Sampling(seed=3), n_best=2)):
        found = translator.translate(texts, prefix="one hundred", **options)
        assert found[2].best.ids == []                                    # empty input stays empty
        for translation in found[:2] + found[3:]:
            assert all(h.ids[:len(prefix)] == prefix for h in translation.hypotheses)
    per_text = translator.translate(["sieben", "acht"], beam=2, prefix=["one", "two"])
    assert [t.best.ids[:1] for t in per_text] == [translator.target_tokenizer.encode(w) for w in ("one", "two")]
    with pytest.raises(UserError, match=r"^prefix: 1 prefixes for 2 texts$"):
        translator.translate(["sieben", "acht"], prefix=["one"])
