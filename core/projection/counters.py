"""The counter tables the projection's pure code writes, by name (one place for all modules)."""

from __future__ import annotations

JOB_COUNTS = "job_group_job_counts"
"""Per job group (recursive) job counts by state; one writer per batch, no token."""
USER_RESOURCES = "user_inst_coll_resources"
"""Ready/running/creating jobs and cores per user and instance collection; tokenized."""
CANCELLABLE = "job_group_inst_coll_cancellable_resources"
"""Live, cancellable resources of each job group's own jobs; tokenized."""
STAGED = "batch_update_job_counts"
"""What an update's bunches added, per group and instance collection, until its commit."""
