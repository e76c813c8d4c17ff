"""DeepSpeed as a training engine: ZeRO stages 0 to 3, optimizer and parameter offload."""
