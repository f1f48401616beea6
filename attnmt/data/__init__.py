"""Corpora, built-in datasets, tokenizers and batching.

Special token ids are fixed for every tokenizer, so models and search can rely on them.
"""

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
