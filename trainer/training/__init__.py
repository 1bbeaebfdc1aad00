"""The run itself: its parts built from the settings (setup), one step, one epoch and an
evaluation (steps), the optimizer and LR schedule (optim), a team's plug-ins (plugins), where
the run is (position), the loop that trains, checkpoints, resumes and reports (run) and what it
comes to (result)."""
