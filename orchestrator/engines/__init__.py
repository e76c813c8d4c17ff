"""Training engines: each runs the probe's steps its own way and owns the memory model of its sharding.

``deepspeed/`` holds DeepSpeed (ZeRO stages 0-3, offload). An engine is a subpackage with its runtime and its
memory model; the probe's search, warm-up and timing loop does not know which engine runs a step.
"""
