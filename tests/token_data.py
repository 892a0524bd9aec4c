"""Token packs and corpora the language-model tests read: a streamed pack, a packed corpus, a
crafted copy with damage of its own, a Hugging Face model's config."""

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from hpctrain.data.tokens.token_pack import TokenPack
from hpctrain.data.tokens.token_packing import TokenPackOptions, pack_tokens


@pytest.fixture
def stream_pack(tmp_path) -> TokenPack:
    """Documents of known ids: document d holds d+1 copies of id d."""
    src = tmp_path / "src"
    (src / "train").mkdir(parents=True)
    (src / "val").mkdir()
    docs = [chr(ord("a") + d) * (d + 1) for d in range(12)]
    (src / "train" / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n"
                                                   for t in docs))
    (src / "val" / "d.jsonl").write_text(json.dumps({"text": "zz"}) + "\n")
    pack_tokens(src, tmp_path / "pack", TokenPackOptions(), workers=1, log=lambda _: None)
    return TokenPack(tmp_path / "pack")


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("packed")
    texts = [f"{a} plus {b} is {a + b}." for a in range(30) for b in range(10)]
    (root / "src" / "train").mkdir(parents=True)
    (root / "src" / "val").mkdir()
    (root / "src" / "train" / "t.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in texts))
    (root / "src" / "val" / "v.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in texts[:20]))
    pack_tokens(root / "src", root / "pack", TokenPackOptions(), workers=1, log=lambda _: None)
    return root / "pack"


def crafted_copy(pack: Path, folder: Path, start: int, length: int) -> Path:
    """A copy of `pack` whose first training document is (start, length), re-hashed into the
    manifest: what a crafted pack looks like."""
    copy = folder / "crafted"
    shutil.copytree(pack, copy)
    manifest = json.loads((copy / "pack.json").read_text())
    entry = manifest["splits"]["train"]["index"]
    docs = np.load(copy / entry["file"])
    docs["start"][0], docs["length"][0] = start, length
    with open(copy / entry["file"], "wb") as handle:
        np.save(handle, docs)
    entry["sha256"] = hashlib.sha256((copy / entry["file"]).read_bytes()).hexdigest()
    (copy / "pack.json").write_text(json.dumps(manifest))
    return copy


@pytest.fixture(scope="module")
def hf_config(tmp_path_factory) -> Path:
    """A one-layer Llama config saved as a user would (nothing downloaded)."""
    from transformers import LlamaConfig

    folder = tmp_path_factory.mktemp("llama")
    LlamaConfig(num_hidden_layers=1, hidden_size=64, intermediate_size=128,
                num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                vocab_size=320, bos_token_id=None, eos_token_id=None).save_pretrained(folder)
    return folder
