"""A Batch node emulator: the payloads infra produces, run as Batch documents running them."""
