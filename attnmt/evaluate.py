"""Scores with sacreBLEU: BLEU (with its signature), chrF and TER on detokenised text, and
BLEU in the convention of the published Multi30k systems.

The WMT multimodal tasks and the papers after them score lowercased, Moses-normalised and
Moses-tokenised text (the dataset's ``*.lc.norm.tok`` files, made by ``lowercase.perl |
normalize-punctuation.perl -l L | tokenizer.perl -l L``) with ``multi-bleu.perl``:
:func:`moses_tokenized` makes that text with sacremoses (the same tokens as the dataset's
files), and BLEU over it without further tokenisation is multi-bleu's BLEU.
"""

from __future__ import annotations

from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF, TER


@dataclass
class Scores:
    bleu: float
    chrf: float
    ter: float
    signature: str                 # BLEU's sacreBLEU signature
    bleu_tok_lc: float | None = None   # lowercased, Moses-tokenised BLEU (the literature's)

    def summary(self) -> str:
        literature = ("" if self.bleu_tok_lc is None else
                      f"  (lowercased Moses-tokenised BLEU {self.bleu_tok_lc:.2f})")
        return (f"BLEU {self.bleu:.2f}  chrF {self.chrf:.2f}  TER {self.ter:.2f}{literature}\n"
                f"signature: {self.signature}")


def corpus_bleu(hypotheses: list[str], references: list[str], lowercase: bool = False) -> float:
    return BLEU(lowercase=lowercase).corpus_score(hypotheses, [references]).score


def score_corpus(hypotheses: list[str], references: list[str], lowercase: bool = False,
                 lang: str | None = None) -> Scores:
    """BLEU, chrF and TER of detokenised hypotheses against one reference each; with the
    target language ``lang``, the literature's BLEU too (:func:`tokenized_lowercased_bleu`)."""
    bleu = BLEU(lowercase=lowercase)
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf = CHRF(lowercase=lowercase).corpus_score(hypotheses, [references]).score
    ter = TER(case_sensitive=not lowercase).corpus_score(hypotheses, [references]).score
    literature = tokenized_lowercased_bleu(hypotheses, references, lang) if lang else None
    return Scores(bleu_score.score, chrf, ter, str(bleu.get_signature()), literature)


def moses_tokenized(lines: list[str], lang: str) -> list[str]:
    """``lines`` lowercased, punctuation-normalised and tokenised as Moses' scripts do for
    language ``lang`` (with its escapes: ``"`` becomes ``&quot;``), tokens joined by spaces."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(normalizer.normalize(line.lower()), return_str=True, escape=True)
            for line in lines]


def tokenized_lowercased_bleu(hypotheses: list[str], references: list[str], lang: str) -> float:
    """BLEU as the published Multi30k systems report it: both sides through
    :func:`moses_tokenized`, then BLEU on those tokens (multi-bleu.perl's figure)."""
    return BLEU(tokenize="none", force=True).corpus_score(
        moses_tokenized(hypotheses, lang), [moses_tokenized(references, lang)]).score


def bleu_by_length(hypotheses: list[str], references: list[str], source_lengths: list[int],
                   edges: tuple[int, ...] = (10, 20, 30, 40, 50)) -> list[tuple[str, int, float]]:
    """BLEU per source-length bucket (source words): ``[(bucket, sentences, BLEU), ...]``."""
    bounds = [0, *edges, None]
    rows = []
    for low, high in zip(bounds, bounds[1:]):
        chosen = [i for i, length in enumerate(source_lengths)
                  if length >= low and (high is None or length < high)]
        if chosen:
            label = f"{low}-{high - 1}" if high is not None else f"{low}+"
            rows.append((label, len(chosen), corpus_bleu([hypotheses[i] for i in chosen],
                                                         [references[i] for i in chosen])))
    return rows
