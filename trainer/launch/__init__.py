"""The node launcher: ``python -m trainer.launch [options] -- COMMAND...`` is the Batch
multi-instance task on every node (``infra/job.py`` builds that command line).

Kept apart from the training program, as Horovod keeps ``horovod/runner`` beside
``horovod/torch``: ``supervisor`` starts and watches this node's workers and records the
outcome, ``rendezvous`` is how the workers meet (Horovod's Gloo rendezvous, the only
``horovod.runner`` import, or the variables torchrun sets for a torch.distributed engine), and
``fabric`` is the one table per VM size (GPUs per node, NCCL/InfiniBand settings, the
bus-bandwidth baseline), whose keys ``infra/sizes.py`` checks against its Azure facts at import.

Importing this package imports nothing else: ``infra`` reads ``trainer.launch.fabric`` in the
Pulumi program and the dynamic provider host, which must not import torch or Horovod.
"""
