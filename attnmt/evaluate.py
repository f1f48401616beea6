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
