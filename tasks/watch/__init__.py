"""Live rollout health: judging a job's counters against thresholds, and the alerts that follow."""
