"""rlx.codegen"""
