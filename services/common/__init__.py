"""Infrastructure shared by every service: settings, the Kafka log adapter, the database."""
