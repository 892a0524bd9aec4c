"""Token packs: a text corpus as memory-mapped files of token ids, and the datasets over them.

Language models read integer ids, not text, so the corpus is tokenized once (`hpctrain pack
--tokens`, token_pack.py) into flat binary shards: little-endian uint16 ids when the vocabulary
fits 65,536, else uint32; every document followed by the end-of-text id. A worker memory-maps
the shards and slices any range without parsing anything.

Layout of a token pack folder (the same rules as an image pack, images/image_pack.py; what
both share is in packs.py):
    pack.json              the manifest: format, pack id, tokenizer, dtype, per split its shards
                           (tokens, bytes, SHA-256) and its index file's SHA-256
    train-00000.bin ...    the shards of a split
    train.index.npy        one DOC_DTYPE record per document: shard, first token, length
    val-00000.bin, val.index.npy
    tokenizer.json         a Hugging Face tokenizer's file, when one was used

Two ways to batch:
- blocks (pre-training's standard): the split read as one stream cut into non-overlapping
  blocks of seq_len + 1 tokens (inputs and the targets shifted by one); documents run into one
  another, separated by the end-of-text id, and no position is padding.
- documents: each document (cut into pieces of at most seq_len + 1 tokens) is one sample,
  starting with end-of-text as its beginning mark; batches of similar lengths come from
  sequences.LengthBucketSampler and are padded to their own longest.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated

import numpy as np
import torch
from pydantic import Field, StringConstraints, ValidationError
from torch.utils.data import Dataset

from hpctrain.data.batch_buffers import RowLayout
from hpctrain.data.tokens.sequences import pad_collate
from hpctrain.data.packs import (MANIFEST, FileName, IndexEntry, Sha256, StrictModel, beyond,
                                 file_sha256, manifest_json, pack_file)
from hpctrain.errors import DataError

FORMAT = "hpctrain-tokens"
VERSION = 1
DOC_DTYPE = np.dtype([("shard", "<u4"), ("start", "<u8"), ("length", "<u4")])


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def shard_name(split: str, number: int) -> str:
    return f"{split}-{number:05d}.bin"


class ShardEntry(StrictModel):
    file: FileName
    tokens: Annotated[int, Field(ge=0)]
    bytes: Annotated[int, Field(ge=0)]
    sha256: Sha256


class SplitEntry(StrictModel):
    documents: Annotated[int, Field(ge=0)]
    tokens: Annotated[int, Field(ge=0)]
    index: IndexEntry
    shards: list[ShardEntry]


class TokenizerEntry(StrictModel):
    kind: Annotated[str, StringConstraints(pattern=r"^(bytes|huggingface)$")]
    vocab_size: Annotated[int, Field(ge=2, le=1 << 32)]
    eos_id: Annotated[int, Field(ge=0)]


class Manifest(StrictModel):
    format: str
    version: int
    pack_id: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
    tokenizer: TokenizerEntry
    dtype: Annotated[str, StringConstraints(pattern=r"^<u[24]$")]
    splits: dict[FileName, SplitEntry]


class TokenPack:
    """An opened token pack: the manifest, checked, and every split's index, checked."""

    def __init__(self, root: Path | str):
        self.root = Path(root).expanduser()
        path = self.root / MANIFEST
        if not path.is_file():
            raise DataError(f"data.path: {self.root} is not a token pack (no {MANIFEST}); make "
                            "one with hpctrain pack --tokens SRC DST")
        data = manifest_json(path, "pack again")
        if not isinstance(data, dict) or (data.get("format"), data.get("version")) != \
                (FORMAT, VERSION):
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            hint = " (an image pack: use data.dataset=shards)" if found == "hpctrain-shards" \
                else ""
            raise DataError(f"{path}: not a {FORMAT} version {VERSION} manifest (found "
                            f"{found}){hint}")
        try:
            self.manifest = Manifest.model_validate(data)
        except ValidationError as err:
            problem = err.errors()[0]
            where = ".".join(str(p) for p in problem["loc"]) or "(top)"
            raise DataError(f"{path}: {where}: {problem['msg']}; pack again with hpctrain "
                            "pack --tokens") from None
        tokenizer = self.manifest.tokenizer
        if tokenizer.eos_id >= tokenizer.vocab_size:
            raise DataError(f"{path}: end-of-text id {tokenizer.eos_id} is outside the "
                            f"vocabulary of {tokenizer.vocab_size}")
        if np.dtype(self.manifest.dtype) != token_dtype(tokenizer.vocab_size):
            raise DataError(f"{path}: dtype {self.manifest.dtype} does not hold a vocabulary "
                            f"of {tokenizer.vocab_size} the way hpctrain writes it; pack again")
        self.splits = {name: TokenSplit(self.root, name, entry, self.dtype, self.vocab_size)
                       for name, entry in self.manifest.splits.items()}

    @property
    def vocab_size(self) -> int:
        return self.manifest.tokenizer.vocab_size

    @property
    def eos_id(self) -> int:
        return self.manifest.tokenizer.eos_id

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.manifest.dtype)

    def split(self, name: str) -> TokenSplit:
        if name not in self.splits:
            raise DataError(f"token pack {self.root} has no {name!r} split (it has "
                            f"{', '.join(self.splits) or 'none'}); pack with a validation "
                            "share (--val-fraction) or train/ and val/ folders")
        return self.splits[name]


class TokenSplit:
    """One split's shards and document index, checked against the manifest: the index's
    SHA-256, each shard's size, and every document's range within its shard."""

    def __init__(self, root: Path, name: str, entry: SplitEntry, dtype: np.dtype,
                 vocab_size: int):
        self.name, self.dtype, self.vocab_size = name, dtype, vocab_size
        self.shards = [pack_file(root, shard.file) for shard in entry.shards]
        self.shard_tokens = np.array([shard.tokens for shard in entry.shards], dtype=np.int64)
        for shard, path in zip(entry.shards, self.shards):
            size = path.stat().st_size if path.is_file() else None
            if size != shard.bytes or shard.bytes != shard.tokens * dtype.itemsize:
                raise DataError(f"token pack shard {path} is {size} bytes, the manifest says "
                                f"{shard.bytes} ({shard.tokens} tokens): missing, truncated or "
                                "replaced; copy or pack it again")
        index_path = pack_file(root, entry.index.file)
        if not index_path.is_file() or file_sha256(index_path) != entry.index.sha256:
            raise DataError(f"{index_path} is missing or is not the index this pack was written "
                            "with (SHA-256 differs); pack again")
        try:
            self.documents = np.load(index_path, allow_pickle=False)
        except ValueError as err:
            raise DataError(f"{index_path} cannot be read ({err}); pack again") from None
        docs = self.documents
        if docs.dtype != DOC_DTYPE or len(docs) != entry.documents:
            raise DataError(f"{index_path} does not hold {entry.documents} document records")
        bad = (docs["shard"] >= len(self.shards))
        # a document's tokens and its closing end-of-text
        bad[~bad] |= beyond(docs["start"][~bad], docs["length"][~bad].astype(np.uint64) + 1,
                            self.shard_tokens[docs["shard"][~bad]])
        if bad.any():
            number = int(np.argmax(bad))
            first = docs[number]
            raise DataError(f"{index_path}: document {number} (shard "
                            f"{first['shard']}, tokens {first['start']} to "
                            f"{int(first['start']) + int(first['length'])}) points outside its "
                            "shard; pack again")
        self._maps: list[np.ndarray] | None = None

    def __getstate__(self):  # workers map the shards themselves
        return {**self.__dict__, "_maps": None}

    def shard(self, number: int) -> np.ndarray:
        if self._maps is None:
            self._maps = [np.memmap(p, dtype=self.dtype, mode="r") if n else
                          np.zeros(0, self.dtype) for p, n in zip(self.shards, self.shard_tokens)]
        return self._maps[number]

    def check_ids(self, ids: np.ndarray, where: str) -> None:
        """Refuse ids outside the vocabulary (a damaged shard must not index past the
        embedding table on the device)."""
        if len(ids) and int(ids.max()) >= self.vocab_size:
            raise DataError(f"token pack {where}: id {int(ids.max())} is outside the "
                            f"vocabulary of {self.vocab_size}: the shard is damaged; pack again")

    def checked(self, ids: np.ndarray, where: str) -> torch.Tensor:
        """Ids as an int32 tensor, once `check_ids` has passed them."""
        self.check_ids(ids, where)
        return torch.from_numpy(ids.astype(np.int32))


class TokenBlocks(Dataset):
    """Non-overlapping blocks of `seq_len + 1` tokens of the split's stream, within shards."""

    def __init__(self, split: TokenSplit, seq_len: int):
        self.split, self.seq_len = split, seq_len
        per_shard = np.maximum(split.shard_tokens - 1, 0) // seq_len
        self.first_block = np.concatenate([[0], np.cumsum(per_shard)])
        if self.first_block[-1] == 0:
            raise DataError(f"the {split.name} split has {int(split.shard_tokens.sum())} tokens, "
                            f"too few for one block of data.tokens.seq_len={seq_len} + 1")

    def __len__(self) -> int:
        return int(self.first_block[-1])

    def __getitem__(self, key) -> torch.Tensor:
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: list) -> list[torch.Tensor]:
        """A batch's blocks in one pass (torch's DataLoader asks for a whole batch here; one
        block at a time cost more than LitData's loader)."""
        out = np.empty((len(keys), self.seq_len + 1), np.int32)
        self.read_into(keys, out)
        return list(torch.from_numpy(out))

    def row_layout(self, size: int) -> RowLayout:
        """One block in a batch buffer (batch_buffers.py): int32, no label."""
        return RowLayout((self.seq_len + 1,), torch.int32, labelled=False)

    def render_rows(self, keys: list, rows: torch.Tensor) -> None:
        """The blocks written into `rows` (a batch buffer's); no labels."""
        self.read_into(keys, rows.numpy())

    def read_into(self, keys: list, out: np.ndarray) -> None:
        """The blocks of `keys` (indices or sample keys) into the rows of `out`: where each
        starts, found for all of them at once, copied in and checked against the vocabulary
        once; a damaged block named by its shard and offset."""
        index = np.fromiter((k[0] if isinstance(k, tuple) else k for k in keys), np.int64,
                            len(keys))
        shards = np.searchsorted(self.first_block, index, side="right") - 1
        starts = (index - self.first_block[shards]) * self.seq_len
        for row, (shard, start) in enumerate(zip(shards.tolist(), starts.tolist())):
            out[row] = self.split.shard(shard)[start:start + self.seq_len + 1]
        if out.size and int(out.max()) >= self.split.vocab_size:
            row = int(np.argmax(out.max(axis=1) >= self.split.vocab_size))
            self.split.check_ids(out[row], f"{self.split.shards[shards[row]].name} at "
                                           f"{starts[row]}")


class TokenDocuments(Dataset):
    """One sample per document (pieces of at most seq_len + 1 tokens), each starting with the
    end-of-text id; `lengths` for the length-bucketed sampler."""

    def __init__(self, split: TokenSplit, seq_len: int, eos_id: int):
        self.split, self.eos_id, self.piece = split, eos_id, seq_len + 1
        docs = split.documents
        # with its leading end-of-text and its own closing one: length + 2 tokens
        sizes = docs["length"].astype(np.int64) + 2
        pieces = np.maximum(1, -(-(sizes - 1) // seq_len))  # overlapping by one token
        self.document = np.repeat(np.arange(len(docs)), pieces)
        self.part = np.arange(len(self.document)) - np.repeat(np.cumsum(pieces) - pieces,
                                                              pieces)
        self.lengths = np.minimum(sizes[self.document] - self.part * seq_len, self.piece)
        if len(self.lengths) == 0:
            raise DataError(f"the {split.name} split of the token pack has no documents")

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, key) -> tuple[torch.Tensor, int]:
        position = int(key[0] if isinstance(key, tuple) else key)
        shard, start, length = self.split.documents[self.document[position]]
        stream = self.split.shard(int(shard))
        # the document's tokens with the end-of-text before them: the previous document's
        # closing id when there is one, else a fresh one
        begin = int(start) + int(self.part[position]) * (self.piece - 1) - 1
        end = min(begin + self.piece, int(start) + int(length) + 1)
        if begin < 0:
            ids = np.concatenate([[self.eos_id], stream[0:end]]).astype(stream.dtype)
        else:
            ids = np.array(stream[begin:end])
            if begin == int(start) - 1:
                ids[0] = self.eos_id
        return self.split.checked(ids, f"{self.split.shards[int(shard)].name} at {begin}"), 0


# a batch of documents padded to its longest, the model's input length a multiple of 8
pad_documents = functools.partial(pad_collate, shift=1)
