"""A run's checkpoints: one ``Checkpointer`` interface (checkpointer) over two formats, one file
by rank 0 (single_file) or every rank's shards (sharded), chosen once from the engine (choose);
when one is due (cadence); writes in the background (background), a copy in Blob storage
(mirror), and the weights a fresh run starts from (init_from)."""
