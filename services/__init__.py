"""The system's services and the infrastructure they share (log adapter, database, local stack)."""
