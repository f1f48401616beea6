"""attnmt: attention-based sequence-to-sequence learning and neural machine translation."""

__version__ = "0.1.0"
