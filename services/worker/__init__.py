"""Worker: runs jobs on an instance, streams logs, reports MJS/MJC and heartbeats (issue 4)."""
