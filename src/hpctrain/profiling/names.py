"""The names hpctrain gives the parts of a training step in traces.

Kept apart from regions.py (which needs torch to record them) so that reading a trace, on a
login node for example, does not import torch.
"""

PREFIX = "hpctrain/"
REGIONS = ("data_wait", "h2d_copy", "forward", "backward", "optimizer")
