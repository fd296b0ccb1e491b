"""What a run is built from: the base config and its checks, the model setup and the engine
(every compiled device function of the run, with its shardings)."""
