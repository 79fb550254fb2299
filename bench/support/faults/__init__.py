"""The fault campaign: two nodes on private Redis + PostgreSQL, and the faults it strikes."""
