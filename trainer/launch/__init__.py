"""The node launcher: ``python -m trainer.launch [options] -- COMMAND...`` is the Batch
multi-instance task on every node (``infra/batch.py`` renders that command line).

Kept apart from the training program, as Horovod keeps ``horovod/runner`` beside
``horovod/torch``. ``main`` wires the concerns: ``batch_env``, ``rendezvous`` (the only
``horovod.runner`` import) and ``store``, ``workers``, ``eviction``, ``records``; ``fabric`` is
the one table per VM size, which ``infra/sizes.py`` checks against its Azure facts at import.

Importing this package imports nothing else: ``infra`` reads ``trainer.launch.node_sizes`` in the
Pulumi program and the dynamic provider host, which must not import torch or Horovod.
"""
