"""The live layer: pykka actors for memory scopes, the memory writer and the runtime's lifecycle.

Nothing here imports ``journaled``.
"""
