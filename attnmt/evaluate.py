"""Scores with sacreBLEU: BLEU (with its signature), chrF and TER on detokenised text."""

from __future__ import annotations

from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF, TER


@dataclass
class Scores:
    bleu: float
    chrf: float
    ter: float
    signature: str                 # BLEU's sacreBLEU signature

    def summary(self) -> str:
        return (f"BLEU {self.bleu:.2f}  chrF {self.chrf:.2f}  TER {self.ter:.2f}\n"
                f"signature: {self.signature}")


def corpus_bleu(hypotheses: list[str], references: list[str], lowercase: bool = False) -> float:
    return BLEU(lowercase=lowercase).corpus_score(hypotheses, [references]).score


def score_corpus(hypotheses: list[str], references: list[str], lowercase: bool = False) -> Scores:
    """BLEU, chrF and TER of detokenised hypotheses against one reference each."""
    bleu = BLEU(lowercase=lowercase)
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf = CHRF(lowercase=lowercase).corpus_score(hypotheses, [references]).score
    ter = TER(case_sensitive=not lowercase).corpus_score(hypotheses, [references]).score
    return Scores(bleu_score.score, chrf, ter, str(bleu.get_signature()))


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
