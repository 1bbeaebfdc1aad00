"""A team's own model and dataset, trained by ``python -m trainer`` through its plug-ins
(docs/trainer.md, "Run your own model"). Nothing here imports the trainer."""
