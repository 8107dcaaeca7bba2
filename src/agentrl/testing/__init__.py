"""Test doubles for the parts that cannot run on a CPU machine without internet.

Each double speaks the real wire protocol of the part it replaces (see docs/testing.md):
``scripted_engine`` (an SGLang server), ``e2b_server`` (the E2B API and envd). ``stack``
builds the real middleware and ``local`` sandboxes around them, and ``pytest_plugin``
(the ``pytest11`` entry point) offers all of them as ``agentrl_*`` fixtures.
"""
