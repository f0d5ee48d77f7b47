"""rlx.examples"""
