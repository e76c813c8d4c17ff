"""PyTorch FSDP2 as a training engine: full, grad-op, no and hybrid sharding, mixed precision, CPU offload."""
