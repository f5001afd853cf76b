"""What a person sees of a run: the live view, plain lines, the transcript, the runs table and
the report.

Everything here is drawn from events, live or read back from the store through
:mod:`orchmode.records`; nothing here runs an agent, so the fan-out and the views never
import each other.
"""
