"""A session: the conversation, the main agent's loop, the library API and resuming.

Below the command line; above the fan-out, which the main agent calls as its Workflow tool,
and the views, which the library API uses for totals.
"""
