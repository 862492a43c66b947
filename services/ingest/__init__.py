"""REST ingest: the Hail Batch v1alpha API on the log (issue 3). Authenticates, validates,
allocates ids, appends events; answers reads from the MySQL projections."""
