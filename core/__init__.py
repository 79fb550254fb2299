"""The shared core every layer may import: errors, settings, models (status table), db.

It imports nothing of ours above it (not `app`, `tasks`, `agents` or `sandbox`); see
tests/test_layers.py for the rule.
"""
