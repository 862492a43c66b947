"""Pure projection logic: events (plus the little state they need) become row operations."""
