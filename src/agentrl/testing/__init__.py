"""Test doubles for the parts that cannot run on a CPU machine without internet.

Each double speaks the real wire protocol of the part it replaces (see docs/testing.md).
"""
