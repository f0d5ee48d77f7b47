"""rlx.runtime"""
