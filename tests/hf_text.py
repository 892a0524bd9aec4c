"""Text classification as a Hugging Face user brings it, with no network: a WordPiece
tokenizer over the reviews' words, a BERT-like classifier built from its config, the samples
as the tokenizer encodes them (a dict of lists and `labels`), DataCollatorWithPadding."""

from __future__ import annotations

import random

import torch

GOOD = "good great fine lovely superb nice".split()
BAD = "bad awful poor terrible dull ugly".split()
FILL = "the a film plot was is and it this actor story very really quite".split()


def reviews(count: int, seed: int) -> list[tuple[str, int]]:
    """Sentences of 4 to 20 words whose one good or bad word is the label (1 or 0)."""
    rng = random.Random(seed)
    made = []
    for _ in range(count):
        label = rng.randrange(2)
        words = rng.choices(FILL, k=rng.randrange(2, 8)) + [rng.choice(GOOD if label else BAD)]
        rng.shuffle(words)
        made.append((" ".join(words), label))
    return made


def tokenizer(corpus: list[str]):
    """A WordPiece tokenizer over the words of `corpus`, as transformers' fast tokenizer. Its
    vocabulary is written out, not trained: tokenizers' trainer breaks ties between equally
    frequent pieces in a per-process hash order, so two processes would number them apart."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    words = sorted({word for text in corpus for word in text.lower().split()})
    vocab = {piece: number for number, piece in enumerate(specials + words)}
    made = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    made.normalizer = normalizers.BertNormalizer()
    made.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    made.post_processor = TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[
        (token, vocab[token]) for token in ("[CLS]", "[SEP]")])
    return PreTrainedTokenizerFast(tokenizer_object=made, pad_token="[PAD]", unk_token="[UNK]",
                                   cls_token="[CLS]", sep_token="[SEP]")


class Encoded(torch.utils.data.Dataset):
    """Reviews as the tokenizer encodes them: input_ids, token_type_ids, attention_mask (lists
    of as many tokens as the review has) and labels."""

    def __init__(self, pairs: list[tuple[str, int]], encode):
        self.items = [dict(encode(text), labels=label) for text, label in pairs]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict:
        return self.items[index]


def classifier(vocab_size: int, seed: int = 0, num_labels: int = 2, dropout: float = 0.0):
    """A two-layer BERT for sequence classification, built from its config (no weights read)."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    return BertForSequenceClassification(BertConfig(
        vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, num_labels=num_labels,
        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout))


def text_task(train: int = 300, val: int = 100):
    """(model, train set, validation set, collator) of a new user's text classifier."""
    from transformers import DataCollatorWithPadding

    train_pairs, val_pairs = reviews(train, 0), reviews(val, 1)
    encode = tokenizer([text for text, _ in train_pairs])
    return (classifier(encode.vocab_size), Encoded(train_pairs, encode),
            Encoded(val_pairs, encode), DataCollatorWithPadding(encode))
