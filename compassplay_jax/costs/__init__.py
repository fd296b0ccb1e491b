"""Models of cost: memory per device (memory_report) and the step's time (step_time_model)."""
