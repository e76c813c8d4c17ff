"""Training engines: each runs the probe's steps its own way and owns the memory model of its sharding.

``deepspeed/`` holds DeepSpeed (ZeRO stages 0-3, offload), ``fsdp/`` PyTorch's FSDP2 (``fully_shard``: full,
grad-op, no and hybrid sharding, CPU offload). ``method.engine`` picks one. An engine is a subpackage with its runtime and its
memory model; the probe's search, warm-up and timing loop does not know which engine runs a step.
"""
