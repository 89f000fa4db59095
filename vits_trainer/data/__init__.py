"""Data: from a user's corpus to batches of clips.

Audio I/O, corpus readers, preparation and its checks, metadata.csv, the in-RAM clip store and its
cache, the length-bucketed sampler and collate, text encoding, and the generated demo corpus.
May import: the package's root modules (errors, safety, runlock, hub, jsonfile, profiling, launch); never
`model` or `training`.
"""
