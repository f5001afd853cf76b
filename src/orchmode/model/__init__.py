"""The model gateway: requests to the provider, adaptive limits, the budget, context size.

Below the executors, which run agents through it; above the store, which keeps the budget.
"""
