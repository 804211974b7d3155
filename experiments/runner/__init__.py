"""Running a sweep: validation at its start, the kernel of a job, the job, the sweep's callback, launchers."""
