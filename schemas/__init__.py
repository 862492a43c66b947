"""The event catalog of the system: events, the envelope, codecs and upcasters.

Import events from :mod:`schemas.events` (the union) or their topic modules; wrap them with
:func:`schemas.envelope.wrap`; put them on the wire with :mod:`schemas.codec`.
"""
