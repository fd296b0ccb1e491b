"""Run infrastructure: sharding, distributed processes, checkpoints, compilation cache and
ahead-of-time compiles, metrics writers, profiling, preemption, garbage-collection policy."""
