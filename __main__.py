"""The gpu-cluster Pulumi program: read and validate the stack config, declare the environment,
export its outputs. The wiring lives in infra/stack.py; each concern in its own component."""

import pulumi

from infra import config, stack

for name, value in stack.declare(config.load()).items():
    pulumi.export(name, value)
