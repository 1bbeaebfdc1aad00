"""The data-parallel trainer (image classifiers, GPT language models, a team's own plug-ins) and
the launcher that starts it on each node: the same code on a laptop CPU and on 8xH100 nodes."""
