"""Pretrained weights, offline first (`model.pretrained: true`).

Compute nodes have no internet, so weights are only ever read from the cache each library
keeps: torchvision's under TORCH_HOME (`hub/checkpoints/`, torch.hub's), timm's under
HF_HOME (the Hugging Face hub cache; a timm model whose weights live at a URL instead, under
TORCH_HOME as torchvision's). A file missing there is one line naming the command that
fetches it where there is internet, `hpctrain prefetch RECIPE` (`prefetch` below), which
downloads into the same caches: on a cluster, point TORCH_HOME and HF_HOME at shared storage
once and every node finds them.

The model is built as its library builds it with those weights, then its classifier is
replaced by a new one for the data's classes (unless the classes are the weights' own), and
the run says which layers were replaced: they start from random values. model.freeze and
optim.pretrained_lr_scale (train/optimizers/optim.py) keep the pretrained part as it is, or train it
slower than the new head.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch
from torch import nn

from hpctrain.errors import ConfigError
from hpctrain.models import download, weight_files

PREFETCH = "hpctrain prefetch RECIPE (on a login node, where there is internet)"


@dataclass(frozen=True)
class Source:
    """Where one model's default weights come from and where they are cached."""

    library: str  # torchvision | timm
    name: str
    tag: str  # the weights' name (IMAGENET1K_V1, resnet18.a1_in1k)
    url: str | None  # a file on the web (torch.hub's cache)
    hub_id: str | None  # a Hugging Face hub repository (its cache)
    hub_files: tuple[str, ...]  # the files timm would read there, the first it finds
    classes: int  # the classifier's outputs the weights were trained with

    def cached(self) -> Path | None:
        """The cached file, or None."""
        if self.hub_id:
            from huggingface_hub import try_to_load_from_cache

            for name in self.hub_files:
                found = try_to_load_from_cache(self.hub_id, name)
                if isinstance(found, str):
                    return Path(found)
            return None
        return self.torch_file() if self.torch_file().is_file() else None

    def torch_file(self) -> Path:
        """Where torch.hub keeps the file of a web URL."""
        return torch_cache() / Path(urlparse(self.url).path).name

    def where(self) -> str:
        return f"the Hugging Face cache ({hub_cache()}) as {self.hub_id}/{self.hub_files[0]}" \
            if self.hub_id else f"{torch_cache()} (TORCH_HOME)"


def torch_cache() -> Path:
    return Path(torch.hub.get_dir()) / "checkpoints"


def hub_cache() -> str:
    """Read at each call: a test or a script may point it elsewhere after the import."""
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def source(library: str, name: str) -> Source:
    """The default pretrained weights of `library`'s model `name`."""
    if library == "torchvision":
        import torchvision

        try:
            weights = torchvision.models.get_model_weights(name).DEFAULT
        except (ValueError, KeyError):
            raise ConfigError(f"model.pretrained: torchvision:{name} has no pretrained "
                              "weights") from None
        return Source(library, name, weights.name, weights.url, None, (),
                      len(weights.meta["categories"]))
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(name)
    if cfg is None or not (cfg.hf_hub_id or cfg.url):
        raise ConfigError(f"model.pretrained: timm:{name} has no pretrained weights")
    files = (cfg.hf_hub_filename,) if getattr(cfg, "hf_hub_filename", None) else \
        ("model.safetensors", "pytorch_model.bin")  # timm reads the first it finds
    return Source(library, name, cfg.tag or name, None if cfg.hf_hub_id else cfg.url,
                  cfg.hf_hub_id, files if cfg.hf_hub_id else (), cfg.num_classes)


def load(library: str, name: str, num_classes: int | None, kwargs: dict) -> nn.Module:
    """The model with its default pretrained weights from the cache, the classifier replaced
    for `num_classes`; `model.pretrained_note` says what was loaded and replaced."""
    found = source(library, name)
    path = found.cached()
    if path is None:
        raise ConfigError(f"model.pretrained: the weights of {library}:{name} ({found.tag}) "
                          f"are not in {found.where()}; fetch them with {PREFETCH}")
    try:
        with weight_files.tensors_only():
            model = _built(found, path, kwargs)
    except weight_files.UNREADABLE as err:
        raise weight_files.refused("model.pretrained", f"the cached weights {path}", err,
                                   f"delete the file and run {PREFETCH} again") from None
    replaced = replace_head(model, num_classes, found.classes) if num_classes else []
    model.replaced_layers = replaced  # trained at optim.lr (optim.pretrained_lr_scale)
    model.pretrained_note = f"pretrained {found.tag} from {path}" + (
        f"; {', '.join(replaced)} replaced for {num_classes} classes (random start)"
        if replaced else "")
    return model


def _built(found: Source, path: Path, kwargs: dict) -> nn.Module:
    if found.library == "torchvision":
        import torchvision

        # the file is in torch.hub's cache: load_state_dict_from_url reads it, downloads nothing
        weights = torchvision.models.get_model_weights(found.name).DEFAULT
        return torchvision.models.get_model(found.name, weights=weights, **kwargs)
    import timm

    return timm.create_model(found.name, pretrained=True, **kwargs,
                             pretrained_cfg_overlay={"file": str(path)})


def replace_head(model: nn.Module, num_classes: int, trained_for: int) -> list[str]:
    """Replace the classifier, the last Linear (or 1x1 Conv2d) giving `trained_for`
    outputs, by a new one giving `num_classes`; its name, or [] where the classes are the
    weights' own."""
    if num_classes == trained_for:
        return []
    heads = [(name, module) for name, module in model.named_modules()
             if (isinstance(module, nn.Linear) and module.out_features == trained_for) or
             (isinstance(module, nn.Conv2d) and module.out_channels == trained_for)]
    if not heads:
        raise ConfigError(f"model.pretrained: no classifier of {trained_for} outputs found to "
                          f"replace for {num_classes} classes; set model.kwargs or use your "
                          "own factory")
    name, old = heads[-1]
    new = nn.Linear(old.in_features, num_classes, bias=old.bias is not None) \
        if isinstance(old, nn.Linear) else \
        nn.Conv2d(old.in_channels, num_classes, old.kernel_size, old.stride, old.padding,
                  bias=old.bias is not None)
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)
    return [name]


def prefetch(library: str, name: str,
             patience: download.Patience = download.Patience()) -> Path:
    """Download the default weights of `library`'s model `name` into its cache (a login
    node's job), checked as they stream (download.py); the file's path. A file of torch.hub
    must hold the SHA-256 its name begins."""
    found = source(library, name)
    if found.hub_id:
        from huggingface_hub import constants

        # the endpoint as now set (HF_ENDPOINT: a mirror), where the library formed its own at
        # import
        return download.hub_files(found.hub_id, hub_cache(), constants.ENDPOINT,
                                  [found.hub_files[0]], patience) / found.hub_files[0]
    path = found.torch_file()
    if not path.is_file():
        named = torch.hub.HASH_REGEX.search(path.name)  # NAME-<SHA-256 prefix>.EXT
        download.fetch(found.url, path, download.Promise(
            algorithm="sha256", digest=named.group(1)) if named else download.Promise(),
            patience=patience)
    return path
