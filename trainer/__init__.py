"""Data-parallel image-classification trainer: the same code on a laptop CPU and on 8xH100 nodes."""
