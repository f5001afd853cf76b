"""The web console (``orchmode serve``): every run of the store, live, in a browser."""
