"""The trainer's settings by section, each declaring its fields with their help and checking
them in a method of its own: model (what to train), data (what it reads and how), schedule (how
long, the optimizer and its learning rate), engine (how the workers reduce, the device and
precision), outputs (the run's folder and checkpoints; the copies to Blob storage), watch
(diagnosis tools; watching the ranks). ``trainer.settings.train_config.TrainConfig`` inherits
them all, flat."""
