"""How the workers of a run talk to each other: one engine per module behind ``Dist`` (base):
Horovod (the default), torch.distributed DDP, FSDP2 and one local process; the engine a run's
settings choose (choose), the device and precision a rank trains with (device) and the CPUs it
keeps to (cpu_affinity)."""
