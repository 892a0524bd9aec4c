"""Variable-length sequences: the tests that train, in this process or in an `hpctrain` process
of their own (the others are tests/unit/test_sequences.py)."""

import json

import numpy as np
import pytest
from torch.utils.data import DataLoader

from hpctrain.data.tokens.sequences import LengthBucketSampler, padding_of
from hpctrain.data.tokens.token_packing import TokenPackOptions, pack_tokens
from hpctrain.data.tokens.tokenizer import BYTE_EOS
from hpctrain.data.tokens.token_pack import TokenDocuments, TokenPack, pad_documents


@pytest.fixture
def lengths():
    return np.random.default_rng(0).integers(5, 500, size=2000)


def test_a_dataloader_with_workers_delivers_every_token_of_a_packs_documents(tmp_path,
                                                                             lengths):
    for split, part in (("train", lengths[:600]), ("val", lengths[:2])):
        (tmp_path / "src" / split).mkdir(parents=True)
        (tmp_path / "src" / split / "d.jsonl").write_text(
            "".join(json.dumps({"text": chr(97 + i % 26) * n}) + "\n"
                    for i, n in enumerate(part)))
    pack_tokens(tmp_path / "src", tmp_path / "pack", TokenPackOptions(), workers=1,
                log=lambda _: None)
    documents = TokenDocuments(TokenPack(tmp_path / "pack").split("train"), seq_len=512,
                               eos_id=BYTE_EOS)
    sampler = LengthBucketSampler(documents.lengths, batch_size=16, seed=0)
    loader = DataLoader(documents, batch_sampler=sampler, collate_fn=pad_documents,
                        num_workers=2)
    delivered = list(loader)
    assert len(delivered) == len(sampler) == 600 // 16  # no piece here is cut: 600 samples
    for batch, indices in zip(delivered, sampler, strict=True):
        for row, index in enumerate(indices):  # each row: its document, unpadded, in order
            real = batch["tokens"][row][batch["mask"][row]]
            assert real.tolist() == documents[index][0].tolist()
            assert real.tolist() == [BYTE_EOS, *[97 + index % 26] * lengths[index], BYTE_EOS]
    assert padding_of(documents.lengths, sampler.batches()) == sampler.padding_fraction() < 0.1
