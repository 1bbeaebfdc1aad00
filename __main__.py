"""The gpu-cluster Pulumi program: read and validate the stack config, declare the environment,
export its outputs. The wiring lives in infra/stack.py; each concern in its own component."""

import pulumi

from infra import stack
from infra.settings.stack import load

for name, value in stack.declare(load()).items():
    pulumi.export(name, value)
