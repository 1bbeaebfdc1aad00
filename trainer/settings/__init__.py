"""The trainer's settings: what each may be (choices), how a value is checked (checks), the
sections that declare each setting with its default and help and check it (sections, declare),
the one frozen ``TrainConfig`` that is every section, flat (train_config), and the flags and
``--config`` YAML that make one (flags). Torch-free: infra and the tools read it."""
