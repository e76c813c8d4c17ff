"""Training engines: each runs the probe's steps its own way and owns the rules and the memory model of its sharding.

``deepspeed/`` holds DeepSpeed (ZeRO stages 0-3, offload), ``fsdp/`` PyTorch's FSDP2 (``fully_shard``: full,
grad-op, no and hybrid sharding, CPU offload), ``mesh3d/`` tensor x pipeline x data parallelism (DTensor tensor
parallelism, ``torch.distributed.pipelining``, FSDP2 over the rest). ``method.engine`` picks one. An engine is one
folder: ``spec.py`` (its ``MethodConfig`` fields, their refusals, its label, its memory and step-time terms; found by
:mod:`orchestrator.engines.registry`), ``engine.py`` (the runtime the probe creates), ``memory.py`` and
``step_time.py`` (its arithmetic). What every engine's memory shares is :mod:`orchestrator.engines.memory`; the
probe's search, warm-up and timing loop does not know which engine runs a step.
"""
