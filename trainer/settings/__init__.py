"""The trainer's settings: what each may be (choices), how a value is checked (checks), the one
frozen ``TrainConfig`` with every default (train_config), and the flags and ``--config`` YAML
that make one (flags). Torch-free: infra and the tools read it."""
