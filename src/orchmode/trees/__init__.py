"""The user's tree for agents that edit code: snapshots, workspaces, patches, merges.

It knows only the core: what a change is (:class:`orchmode.core.results.Change`) and errors.
"""
