"""Torch-free helpers every room of the trainer shares, and infra and dt_commands read: the
one-line error style, the command-line style, files written whole, Blob folders and their
clients, and waiting out a role assignment that has not arrived."""
