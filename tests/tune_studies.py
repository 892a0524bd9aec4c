"""What the tune tests search: the learning-rate space, and a search prepared without
running it."""

from hpctrain.tune.search import Options, prepare

LR = "optim.lr=loguniform(1e-5,1)"


def prepared(tiny, tmp_path, *extra, space_specs=(LR,), trials=2, **options):
    folder, search = prepare("default", tiny(*extra), Options(
        space=list(space_specs), trials=trials, folder=str(tmp_path / "search"), **options))
    return folder, search
