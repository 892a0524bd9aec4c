"""Optimisers and schedules: hpctrain's (with LARS, LAMB, LR scaling, warmup, EMA) and a
LightningModule's own."""
