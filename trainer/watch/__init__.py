"""What watches a run while it trains: the step watchdog, stragglers and the ranks' shared
times (rank_watch), GPU telemetry, the gradient noise scale, MFU, the profiler window, the
debugger's rank, the stop signals, and the allreduce check before the first step."""
