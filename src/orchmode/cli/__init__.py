"""The command line: ``orchmode run``, ``chat`` and the commands that read what runs left.

The top layer: it may import every other one, and nothing imports it.
"""
