"""The small shared core every layer may import: settings, prompts, events, errors, results.

It imports nothing else of orchmode, so it can never be part of a cycle.
"""
