"""CrossGuard policy pack for gpu-cluster stacks; the rules live in ``policy.rules``."""
