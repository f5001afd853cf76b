"""The fan-out: the Workflow tool, orchestration scripts, and what comes of their results.

Both forms of a call start every agent through one engine (:mod:`.engine`), which asks the
executors to run it; scripts and the flat fan-out never import each other.
"""
