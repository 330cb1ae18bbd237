"""The log layer: event and message types, the codec, the journal and the projections.

Nothing here imports ``actors``, ``journaled`` or ``pykka``.
"""
