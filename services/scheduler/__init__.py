"""Scheduler: the single active, fenced consumer that schedules, autoscales and cancels (issue 4)."""
