"""Tensor × pipeline × FSDP2 data parallelism on one PyTorch device mesh, applied to the families' modules."""
