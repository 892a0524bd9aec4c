from hpctrain.console import entry

entry()
