"""Copies of the user's tree for agents that edit code: snapshots, copies, patches, merges.

It knows only the core: what a change is (:class:`orchmode.core.results.Change`) and errors.
"""
