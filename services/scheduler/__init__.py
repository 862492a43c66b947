"""Scheduler: the single active, fenced consumer that schedules, autoscales, cancels (issue 4)."""
