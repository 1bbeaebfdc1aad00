"""Tests of the job as Batch runs it, on the Batch node emulator (tests/batch_emulator)."""
