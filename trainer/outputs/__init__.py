"""What a run writes for people: metrics.jsonl, TensorBoard and the progress lines (metrics),
their live copy in Blob storage (live_upload), and a finished run's results with the manifest
written last (results, results_manifest)."""
