"""Payloads of the reward-integrity attack battery (tests/agents/test_reward_attacks.py)."""
