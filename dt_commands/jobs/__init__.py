"""``dt-jobs``: follow a stack's training jobs, one module per command over the stack's outputs
read once (``dt_commands.stack_outputs``); ``main`` builds the parser and runs the command.
What each command reads and with which roles: docs/jobs.md."""
