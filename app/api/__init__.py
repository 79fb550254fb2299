"""REST blueprints: v1 jobs/rollouts/llm-servers, health + metrics, ProRL-compatible routes."""
