"""What a person sees of a run: the live view, plain lines, history, totals and the report.

Everything here is drawn from events, live or read back from the store; nothing here runs
an agent, so the fan-out and the views never import each other.
"""
