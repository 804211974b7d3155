"""The GPU side: the worker process, verification against a float64 reference, timing, GPU locks."""
