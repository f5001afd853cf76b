"""The tools every agent calls: bash with its events, tool results, the user's MCP servers.

A sibling of the model gateway (neither imports the other), above the shell.
"""
