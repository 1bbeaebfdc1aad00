"""Examples of using the trainer with a team's own code."""
