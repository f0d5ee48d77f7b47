"""rlx.build"""
