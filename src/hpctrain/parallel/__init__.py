"""How the processes of a run share the work: the layout (layout.py: data x tensor x pipeline,
the strategy), the process group and its collectives (processes.py), and one module per
parallelism: data.py (DDP, FSDP2), tensor.py, pipeline.py (with stage_split.py), and the
gradient norm over a model copy spread across processes (grad_norm.py)."""
