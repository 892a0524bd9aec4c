from hpctrain.cli import entry

entry()
