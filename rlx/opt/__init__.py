"""Optimizer passes, the pass pipeline and the memory planner."""
