"""rlx.models"""
