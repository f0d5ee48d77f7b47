"""rlx.toolchain"""
