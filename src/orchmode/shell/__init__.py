"""Bash for the agents: persistent sessions, the bubblewrap sandbox, and a secret-free env.

It knows nothing of models, stores or fan-outs: only the core's settings and errors.
"""
