"""Audit: the event history of a batch or job from the log, and rebuild-and-diff of projections."""
