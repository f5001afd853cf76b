"""Recorded runs: events written to the store and read back by their one declaration, and
what is read from them (a session's history and totals).

Resuming a session and every view of a run (``runs``, ``show``, ``budget``, the report) read
the same records the same way, so this sits below both, on the store and the core alone.
"""
