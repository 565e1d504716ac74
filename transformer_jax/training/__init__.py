"""The shared trainer: state, step, loop, checkpoints, schedules, preemption, metric writers."""
