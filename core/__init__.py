"""The pure domain core: no asyncio, web, Kafka, SQL or cloud imports.

Every service calls the same functions here: one model of a job, of fair share, of billing.
"""
